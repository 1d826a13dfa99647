"""The BGP backend (`--backend bgp`): BIRD 2 as the agent's child, configured from the cluster.

    model.py        typed, validated configuration values (AS numbers, addresses, peers, timers)
    bird_config.py  `render_bird_config`: the one renderer of BIRD's configuration text (pure)
"""
