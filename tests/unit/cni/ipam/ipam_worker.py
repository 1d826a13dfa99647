"""A child process that allocates addresses, for the cross-process IPAM concurrency tests."""

WORKER_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from cni.config import parse_netconf
from cni.ipam.builtin import BuiltinIpam
from cni.request import CniRequest
conf = parse_netconf(sys.argv[2].encode())
ipam = BuiltinIpam()
out = []
for i in range(int(sys.argv[4])):
    req = CniRequest(command="ADD", container_id=f"{sys.argv[3]}-{i}", netns="/x", ifname="eth0")
    out.append(ipam.add(conf, req)["ips"][0]["address"])
print(json.dumps(out))
"""
