"""The BGP backend (`--backend bgp`): BIRD 2 as the agent's child, configured from the cluster.

    model.py         typed, validated configuration values (AS numbers, addresses, peers, timers)
    bird_config.py   `render_bird_config`: the one renderer of BIRD's configuration text (pure)
    topology.py      full mesh, route reflectors, external peers: the cluster's view as a config
    control.py       the `BirdControl` seam; `supervisor.py` (BIRD as a child process) and
                     `fake_control.py` (in memory)
    learnt.py        the routes BIRD learnt, read from our kernel table, and their changes
                     (+ `fake_learnt.py`)
    status.py        `show protocols all` parsed into sessions (pure)
    speaker.py       `BgpSpeaker`: the agent's side of all of the above

Which learnt routes the plan copies into main is the routing mode's rule, in
`noderoutes/routing/bgp.py` (the speaker fills its `LearntTable`): this package imports
`routing/`, `routing/` never imports this package.
"""
