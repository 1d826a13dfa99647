"""The policy's nftables dataplane: table `ip netagent-policy` (`ip6` the same shape), a
`Table` of kernel/nftables/model.py. `render.py` (pure: a plan -> the `Table`, in an
`NftPolicy`), `dataplane.py` (`NftablesDataplane`: writes kernel/nftables/changes.py's
difference), `readback.py` (pure: the table's listing back into policy/readback.py's values)."""
