"""`--backend bgp`'s flags (and `--auto-bgp`) and the BGP speaker the daemon hands the node agent.

The flags are the topology's defaults (`TopologySettings`); the ConfigMap `--bgp-config`
(namespace/name, default kube-system/netagent-bgp) overrides them value by value, through a
reflector on that one object whose changes ask the agent for a sync (`config_reflector`: in its
namespace, a field selector on its name, since the manifest's Role grants list and watch on that
name alone and RBAC honours `resourceNames` for a list or watch only so). BIRD runs as the
agent's child with its files under `--bgp-state-dir`. The flags reach `build_bgp` parsed, as
config.py's `BgpConfig` (whether BIRD runs, `BgpConfig.wanted`, decided there too).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from netagent.kernel import owned

if TYPE_CHECKING:
    from netagent.daemon.config import BgpConfig
    from netagent.kube.reflector import EventHandler, Reflector

DEFAULT_CONFIG = "kube-system/netagent-bgp"


def add_bgp_flags(group) -> None:
    group.add_argument("--auto-bgp", choices=["on", "off"], default="off",
                       help="--backend auto: also run BIRD, and route a peer on another subnet over its "
                            "BGP-learnt route when there is one (encapsulation otherwise)")
    group.add_argument("--bgp-state-dir", default=owned.BIRD_STATE_DIR,
                       help="BIRD's configuration file, control socket and log (--backend bgp)")
    group.add_argument("--bgp-as", type=int, default=64512, help="the cluster's AS number (default 64512)")
    group.add_argument("--bgp-mesh", choices=["on", "off"], default="on", help="node-to-node full mesh")
    group.add_argument("--bgp-bfd", choices=["on", "off"], default="off", help="BFD on every session")
    group.add_argument("--bgp-reflector-label", default="node-restriction.kubernetes.io/netagent-route-reflector",
                       help='Nodes with this label set to "true" are route reflectors (a key under '
                            'node-restriction.kubernetes.io/, which no kubelet may set on its Node)')
    group.add_argument("--bgp-config", default=DEFAULT_CONFIG,
                       help="namespace/name of the topology ConfigMap (overrides the --bgp-* defaults)")


def config_reflector(*, api_client, config: str, handler: EventHandler) -> Reflector:
    """The reflector on the topology ConfigMap `config` ("namespace/name", no namespace: default),
    not started: that one object, in its namespace. Its key in the reflector's store is
    "namespace/name"."""
    from netagent.kube.reflector import Reflector
    from netagent.kube.resources import CONFIG_MAPS
    namespace, _, name = config.rpartition("/")
    return Reflector(api_client=api_client, resource=CONFIG_MAPS, handler=handler,
                     namespace=namespace or "default", field_selector=f"metadata.name={name}")


def config_key(config: str) -> str:
    """The store key of the ConfigMap `config` names."""
    namespace, _, name = config.rpartition("/")
    return f"{namespace or 'default'}/{name}"


def build_bgp(bgp: BgpConfig, *, api_client, rejections):
    """(speaker, config reflector) when BIRD runs (`bgp.wanted`: --backend bgp, or auto with
    --auto-bgp on), else (None, None). The reflector is started here; the caller stops it on
    shutdown."""
    if not bgp.wanted:
        return None, None
    from netagent.kube.changes import ChangeRecorder
    from netagent.noderoutes.bgp.learnt import NetlinkLearntRoutes
    from netagent.noderoutes.bgp.speaker import BgpSpeaker
    from netagent.noderoutes.bgp.supervisor import BirdSupervisor
    from netagent.noderoutes.bgp.topology import TopologySettings
    defaults = TopologySettings(asn=bgp.asn, mesh=bgp.mesh, bfd=bgp.bfd, reflector_label=bgp.reflector_label)
    key = config_key(bgp.config_map)
    speaker: BgpSpeaker

    def changed() -> None:
        speaker.poke()

    recorder = ChangeRecorder("bgp-config", on_change=changed)
    reflector = config_reflector(api_client=api_client, config=bgp.config_map, handler=recorder)
    speaker = BgpSpeaker(bird=BirdSupervisor(bgp.state_dir), learnt=NetlinkLearntRoutes(), topology=defaults,
                         rejections=rejections, topology_source=lambda: reflector.store.get(key))
    reflector.start()
    return speaker, reflector
