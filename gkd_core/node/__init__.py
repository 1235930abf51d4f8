"""The node agent: GPU probes that flag their own hangs, and stack capture for local pids."""
