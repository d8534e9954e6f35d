"""A stock gRPC client (grpcio, gRPC's C core: the Debian package python3-grpcio) for
tests/grpc_stock_client.rs: one bidirectional call to /chat.Chat/Talk, sending raw-byte
messages as fast as the call takes them, reading the echoes until the call ends.

    python3 grpc_stock_client.py ADDR COUNT SIZE COMPRESS

COUNT messages of SIZE bytes each (zeros after a message number: they compress well);
COMPRESS is "gzip" (the call's messages compressed by the client) or "none". Prints one
line of JSON: the echoes read, the seconds from the call's start to its end, the status
code's name and details, and the trailing metadata (binary values as hex).
"""

import json
import sys
import time

import grpc


def main():
    addr, count, size, compress = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    compression = grpc.Compression.Gzip if compress == "gzip" else grpc.Compression.NoCompression

    def messages():
        for i in range(count):
            head = b"%d:" % i
            yield head + b"\0" * max(0, size - len(head))

    with grpc.insecure_channel(addr) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        talk = channel.stream_stream("/chat.Chat/Talk")
        start = time.monotonic()
        echoes = 0
        intact = True
        code, details, trailing = "OK", "", []
        call = talk(messages(), compression=compression, timeout=120)
        try:
            for echo in call:
                head = b"%d:" % echoes
                intact = intact and echo.startswith(head) and len(echo) == max(size, len(head))
                echoes += 1
        except grpc.RpcError as error:
            code, details = error.code().name, error.details()
            trailing = error.trailing_metadata() or []
        elapsed = time.monotonic() - start
        print(
            json.dumps(
                {
                    "echoes": echoes,
                    "intact": intact,
                    "seconds": elapsed,
                    "code": code,
                    "details": details,
                    "trailing": {
                        m.key: (m.value.hex() if isinstance(m.value, bytes) else m.value)
                        for m in trailing
                    },
                }
            )
        )


if __name__ == "__main__":
    main()
