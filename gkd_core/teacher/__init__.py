"""The teacher service: a ZeroMQ ROUTER/DEALER proxy, N workers, and a client with deadlines."""
