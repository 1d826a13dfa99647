"""The ipset text formats: the `ipset restore` input netagent writes, and the `ipset save` and
`ipset list -t` output it reads. Pure: text in, values out.

Why apart from the runner. The text is where the real tool and the fake must agree: the
runner sends `restore_lines` to `ipset restore -exist`, and `FakeIpset` applies the same
(create, changes) in the same order and counts lines the way this text numbers them, so a
full set is reported at the same line by both. Parsing is kept here so it is unit-tested on captured
output without root.

`parse_list` reads a set's header and members from one `ipset list NAME`.

The restore input is every `create` first, then per set its `del` lines before its `add`
lines, so removals free room before the adds count against `maxelem`. `create` takes
`family` (the spec's, `inet` or `inet6`) and `maxelem` for hash types; bitmap:port takes the full port range instead.
Each token is checked by `iptables.tokens.ipset_token` (the one escaping module: ipset has no
escapes, so anything but a name's or member's characters is refused, never written).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from netagent.kernel.ipset.model import (
    PORT_RANGE,
    IpsetError,
    IpsetInfo,
    IpsetSpec,
    IpsetType,
    SetContents,
)
from netagent.kernel.iptables.tokens import ipset_token

_HEADER_FIELD = re.compile(r"^(Name|Type|Header|References|Number of entries):\s*(.*)$")


def create_arguments(spec: IpsetSpec) -> list[str]:
    """`ipset create` arguments for a spec (after the word `create`)."""
    if spec.type is IpsetType.BITMAP_PORT:
        return [spec.name, spec.type.value, "range", f"{PORT_RANGE[0]}-{PORT_RANGE[1]}"]
    return [spec.name, spec.type.value, "family", spec.family, "maxelem", str(spec.max_elements)]


def restore_lines(*, create: Sequence[IpsetSpec],
                  changes: Mapping[str, tuple[Sequence[str], Sequence[str]]]) -> list[str]:
    """`ipset restore` input for `Ipset._apply`, in the order both implementations apply it.
    Every name and member passes `ipset_token` (UnsafeText otherwise): ipset restore has no
    escapes, so a token with a quote, a blank or a control character would change the line."""
    lines = [" ".join(["create", *map(ipset_token, create_arguments(spec))]) for spec in create]
    for name, (add, remove) in changes.items():
        name = ipset_token(name)
        lines += [f"del {name} {ipset_token(member)}" for member in remove]
        lines += [f"add {name} {ipset_token(member)}" for member in add]
    return lines


def parse_members(text: str, name: str) -> frozenset[str]:
    """The members of set `name` in `ipset save NAME` output."""
    found = set()
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "add" and words[1] == name:
            found.add(words[2])
    return frozenset(found)


def parse_save(text: str) -> dict[str, SetContents]:
    """Every set in `ipset save` output, with its members."""
    headers: dict[str, tuple[IpsetType | str, str | None]] = {}
    members: dict[str, set[str]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "create":
            options = dict(zip(words[3::2], words[4::2]))
            try:
                set_type: IpsetType | str = IpsetType(words[2])
            except ValueError:
                set_type = words[2]
            headers[words[1]] = (set_type, options.get("family"))
            members.setdefault(words[1], set())
        elif len(words) >= 3 and words[0] == "add":
            members.setdefault(words[1], set()).add(words[2])
    return {name: SetContents(name, set_type, family, frozenset(members.get(name, ())))
            for name, (set_type, family) in headers.items()}


def parse_list(text: str) -> tuple[IpsetInfo, frozenset[str]]:
    """(header, members) from `ipset list NAME` output: the header's fields, then one member
    per line after `Members:` (its first word: the spelling `ipset save` prints)."""
    head, _, members = text.partition("\nMembers:\n")
    return parse_header(head), frozenset(line.split()[0] for line in members.splitlines() if line.strip())


def parse_header(text: str) -> IpsetInfo:
    """IpsetInfo from `ipset list -t NAME` output."""
    fields = {}
    for line in text.splitlines():
        found = _HEADER_FIELD.match(line.strip())
        if found:
            fields[found.group(1)] = found.group(2).strip()
    try:
        raw_type = fields["Type"]
        header = fields.get("Header", "").split()
        options = dict(zip(header[::2], header[1::2]))
        try:
            set_type: IpsetType | str = IpsetType(raw_type)
        except ValueError:
            set_type = raw_type
        return IpsetInfo(name=fields["Name"], type=set_type, family=options.get("family"),
                         references=int(fields.get("References", "0")),
                         entries=int(fields.get("Number of entries", "0")),
                         max_elements=int(options["maxelem"]) if "maxelem" in options else None)
    except (KeyError, ValueError) as error:
        raise IpsetError(f"cannot parse ipset header ({error}): {text[:200]!r}") from None
