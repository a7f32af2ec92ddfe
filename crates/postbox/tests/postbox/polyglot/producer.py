"""A Python service writing its business rows and its events in one psycopg 3 transaction,
through Postbox's SQL API. Driven by crates/postbox/tests/postbox/polyglot.rs: one command per line on
stdin, one answer per line on stdout (the protocol is described there).

Run: python3 producer.py postgres://postgres@127.0.0.1:5432/app
"""

import sys
import time

try:
    import psycopg
    from psycopg.types.json import Jsonb
except ImportError as e:
    print(f"producer.py needs psycopg 3 ({e}); run scripts/install-deps", file=sys.stderr)
    sys.exit(3)

PRODUCER = "python"


def enqueue(conn, order_id, key):
    """A business row and its event; the event's id, or None for a duplicate."""
    conn.execute(
        "INSERT INTO orders (order_id, producer) VALUES (%s, %s)", (order_id, PRODUCER)
    )
    # "-": the daily key (NULL); "none": no key at all; anything else: that key.
    return conn.execute(
        "SELECT postbox_enqueue(event_type => %s, aggregate_type => %s, aggregate_id => %s,"
        " payload => %s, idempotency_key => %s, without_idempotency_key => %s)",
        (
            "OrderPlaced",
            "Order",
            str(order_id),
            Jsonb({"order_id": order_id, "producer": PRODUCER}),
            None if key in ("-", "none") else key,
            key == "none",
        ),
    ).fetchone()[0]


def enqueue_many(conn, keys):
    """One batch of events with the given keys; their ids in order, None for duplicates."""
    events = [
        {"event_type": "OrderNoted", "payload": {"n": i}, "idempotency_key": k}
        for i, k in enumerate(keys)
    ]
    return conn.execute("SELECT postbox_enqueue_many(%s)", (Jsonb(events),)).fetchone()[0]


def invalid(conn):
    """An event with an empty type: the error's SQLSTATE and the argument it names."""
    try:
        conn.execute("SELECT postbox_enqueue(%s, NULL, NULL, '{}')", ("",))
        return "error none"
    except psycopg.Error as e:
        return f"error {e.sqlstate} {e.diag.column_name}"


def null(value):
    return "null" if value is None else str(value)


def main():
    if len(sys.argv) != 2:
        print("usage: producer.py <database url>", file=sys.stderr)
        sys.exit(2)
    # psycopg opens a transaction at the first statement; `commit` or `rollback` ends it.
    conn = psycopg.connect(sys.argv[1])
    try:
        for line in sys.stdin:
            words = line.split()
            command = words[0]
            if command == "enqueue":
                answer = "enqueued " + null(enqueue(conn, int(words[1]), words[2]))
            elif command == "many":
                answer = "ids " + ",".join(null(i) for i in enqueue_many(conn, words[1].split(",")))
            elif command == "invalid":
                answer = invalid(conn)
            elif command == "commit":
                conn.commit()
                answer = f"committed {time.time_ns() // 1000}"
            elif command == "rollback":
                conn.rollback()
                answer = "rolledback"
            elif command == "quit":
                return
            else:
                raise ValueError(f"unknown command: {line!r}")
            print(answer, flush=True)
    finally:
        # Closing with a transaction open rolls it back.
        conn.close()


if __name__ == "__main__":
    main()
