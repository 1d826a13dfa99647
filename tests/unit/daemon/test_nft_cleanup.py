"""`netagent cleanup`'s nft part (`daemon/cleanup.remove_owned_nft_tables`) on `FakeNft`: every
table named with `owned.NFT_TABLE_PREFIX` goes, in every family, in one transaction; other
tables stay; a second run removes nothing."""
from __future__ import annotations

from netagent.daemon.cleanup import remove_owned_nft_tables
from netagent.kernel import owned
from netagent.kernel.nftables.fake import FakeNft


def test_ours_in_every_family_go_and_others_stay():
    nft = FakeNft()
    nft.apply("\n".join([f"add table ip {owned.NFT_PROXY_TABLE}", f"add table ip6 {owned.NFT_PROXY_TABLE}",
                         f"add table ip {owned.NFT_MASQUERADE_TABLE}", f"add table inet {owned.NFT_POLICY_TABLE}",
                         f"add chain ip {owned.NFT_MASQUERADE_TABLE} POSTROUTING "
                         "{ type nat hook postrouting priority srcnat; policy accept; }",
                         "add table ip kube-proxy", "add table inet filter"]))
    removed = remove_owned_nft_tables(nft)
    assert sorted(removed) == sorted([f"nft table ip {owned.NFT_PROXY_TABLE}", f"nft table ip6 {owned.NFT_PROXY_TABLE}",
                                      f"nft table ip {owned.NFT_MASQUERADE_TABLE}",
                                      f"nft table inet {owned.NFT_POLICY_TABLE}"])
    assert sorted(nft.tables()) == [("inet", "filter"), ("ip", "kube-proxy")]
    assert len(nft.batches) == 2
    assert remove_owned_nft_tables(nft) == [] and len(nft.batches) == 2
