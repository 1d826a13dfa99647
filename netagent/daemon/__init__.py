"""The daemon's wiring: `netagent run` (node routes, CNI server, service proxy, status), `cleanup`
and `status services`. The one layer that knows every other; nothing below imports it."""
