"""The dashboard's panes. Each reads the RunState it is given; none talks to a socket."""
