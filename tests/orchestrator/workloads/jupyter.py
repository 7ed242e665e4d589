"""A small client of a Jupyter server, as a browser talks to it: its REST API (status,
kernels) and a kernel's WebSocket (an execute_request, the stream it prints). Standard
library only: the WebSocket handshake and frames (RFC 6455) are written out here, enough
for text messages from a client."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
import urllib.request
import uuid
from urllib.parse import urlparse


def api(url: str, token: str, path: str, method: str = "GET", body: dict | None = None,
        timeout: float = 30) -> dict:
    """A JSON answer of the server at URL (http://host:port) to METHOD PATH."""
    request = urllib.request.Request(
        f"{url}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read() or b"{}")


class WebSocket:
    """One WebSocket connection, text frames only."""

    def __init__(self, url: str, path: str, token: str, timeout: float = 60) -> None:
        place = urlparse(url)
        self.sock = socket.create_connection((place.hostname, place.port or 80),
                                             timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {place.netloc}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                           f"Authorization: token {token}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise ConnectionError(f"no WebSocket: {head.decode(errors='replace')}")

    def send(self, text: str) -> None:
        data, mask = text.encode(), os.urandom(4)
        size = len(data)
        head = bytes([0x81]) + (bytes([0x80 | size]) if size < 126 else
                                bytes([0x80 | 126]) + struct.pack(">H", size) if size < 65536
                                else bytes([0x80 | 127]) + struct.pack(">Q", size))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _exactly(self, n: int) -> bytes:
        got = b""
        while len(got) < n:
            part = self.sock.recv(n - len(got))
            if not part:
                raise ConnectionError("the server closed the WebSocket")
            got += part
        return got

    def receive(self) -> str:
        """The next text message (pings and other control frames are passed over)."""
        message = b""
        while True:
            first, second = self._exactly(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack(">H", self._exactly(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", self._exactly(8))[0]
            payload = self._exactly(size)
            if first & 0x0F >= 0x8:      # close, ping, pong
                if first & 0x0F == 0x8:
                    raise ConnectionError("the server closed the WebSocket")
                continue
            message += payload
            if first & 0x80:             # the final fragment
                return message.decode()

    def close(self) -> None:
        self.sock.close()


def execute(url: str, token: str, kernel: str, code: str, timeout: float = 120) -> str:
    """What CODE prints on stdout in KERNEL (an execute_request over its WebSocket)."""
    ws = WebSocket(url, f"/api/kernels/{kernel}/channels", token)
    try:
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False,
                        "stop_on_error": True}}))
        printed, deadline = "", time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = json.loads(ws.receive())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream" and msg["content"]["name"] == "stdout":
                printed += msg["content"]["text"]
            elif kind == "error":
                raise RuntimeError(f"the kernel raised: {msg['content']}")
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                return printed
        raise TimeoutError(f"no answer from kernel {kernel} within {timeout:.0f} s")
    finally:
        ws.close()
