"""nf_tables: the one way netagent talks to the kernel's nftables (`--proxy-mode nftables`).

- `runner.py`: `Nft`, the seam (apply one text batch as one transaction, list a table as
  libnftables JSON, list tables), `NftRunner` (libnftables in-process, in a namespace of the
  caller's choosing, never another), `NftError`, `nftables_usable()`.
- `netlink.py`: element-only writes (`Nft.apply_elements`, `model.ElementWrite`) encoded as
  nf_tables netlink messages, one batch, without libnftables' parser (the large tables' cost).
- `text.py`: the one place a string becomes nft text (names, interface names, comments,
  addresses, ports, element lists).
- `model.py`: the typed table model (tables, chains, sets, maps, elements, rules), its
  renderer and digest; `tables.py`: a table read back into it, the differ, `ensure_table`.
- `fake.py`: `FakeNft`, the stateful fake of the seam for the subset of nft text netagent
  writes (the parsing of that subset in `fake_parse.py`).

Each component owns one table per family (kernel/owned.py's `NFT_*_TABLE`) and writes only it.
"""
