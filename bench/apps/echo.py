"""Stream apps for the issue-7 benchmarks (bench/*_bench.py)."""


class Echo:
    """Writes back whatever arrives."""

    def on_data(self, conn, data):
        conn.write(data)


class CloseOnConnect:
    """Closes every connection as soon as it is accepted (accept_bench)."""

    def on_connect(self, conn):
        conn.close()

    def on_data(self, conn, data):
        conn.close()


class Idle:
    """Accepts and keeps connections, discards input (idle_bench)."""

    def on_data(self, conn, data):
        pass
