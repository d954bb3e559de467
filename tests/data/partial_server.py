#!/usr/bin/env python3
"""A server that dies mid-transfer: announces 100000 bytes, sends 5000,
closes. usage: partial_server.py PORT (serves one request, then exits)."""
import socket
import sys

s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(1)
print("ready", flush=True)
c, _ = s.accept()
c.recv(4096)
c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nContent-Type: application/octet-stream\r\n\r\n" + b"x" * 5000)
c.close()
s.close()
