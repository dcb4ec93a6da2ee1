# codexec's Jupyter server (codexec-gateway.service, and the quickstart's):
# ZeroMQ's default of 1023 sockets per context (a few per kernel and per
# channels connection) would make sockets, not memory, the ceiling on
# kernels (about 175). See README.md, "Capacity".
import zmq

zmq.Context.instance().set(zmq.MAX_SOCKETS, 65536)
