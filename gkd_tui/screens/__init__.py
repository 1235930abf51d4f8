"""The dashboard's screens on top of the main one: confirmations, the restart diff, stacks, help."""
