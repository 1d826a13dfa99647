"""The agent's side of the CNI plugin: the root-only socket server, the installer of binaries
and network config, and the DEL journal that finishes deletes in the background."""
