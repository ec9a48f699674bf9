"""The asyncio transport: HTTP/1.1 keep-alive connections on one event-loop thread (wire, connection, bridge)."""
