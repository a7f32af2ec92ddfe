"""A Python consumer that applies each message's effect once, through Postbox's SQL inbox: in one
psycopg 3 transaction it calls postbox_inbox_receive and, only when that answers true, writes
the effect (a row of `ledger`). Driven by crates/postbox/tests/postbox/polyglot.rs, one command per line
on stdin, one answer per line on stdout:
- `handle <message id> <amount>`: receive, apply, commit. -> `new` or `duplicate`
- `hold <message id> <amount>`: receive and apply, leaving the transaction open (the test then
  kills the process, as a crash before the commit). -> `held new` or `held duplicate`
- `quit`

Run: python3 consumer.py postgres://postgres@127.0.0.1:5432/app
"""

import sys

try:
    import psycopg
except ImportError as e:
    print(f"consumer.py needs psycopg 3 ({e}); run scripts/install-deps", file=sys.stderr)
    sys.exit(3)

CONSUMER = "python-ledger"


def receive(conn, message_id, amount):
    """Records the message and applies its effect when it is new; whether it was."""
    new = conn.execute(
        "SELECT postbox_inbox_receive(%s, %s)", (CONSUMER, message_id)
    ).fetchone()[0]
    if new:
        conn.execute(
            "INSERT INTO ledger (message_id, amount, consumer) VALUES (%s, %s, 'python')",
            (message_id, amount),
        )
    return "new" if new else "duplicate"


def main():
    if len(sys.argv) != 2:
        print("usage: consumer.py <database url>", file=sys.stderr)
        sys.exit(2)
    conn = psycopg.connect(sys.argv[1])
    try:
        for line in sys.stdin:
            words = line.split()
            command = words[0]
            if command == "handle":
                answer = receive(conn, words[1], int(words[2]))
                conn.commit()
            elif command == "hold":
                answer = "held " + receive(conn, words[1], int(words[2]))
            elif command == "quit":
                return
            else:
                raise ValueError(f"unknown command: {line!r}")
            print(answer, flush=True)
    finally:
        conn.close()


if __name__ == "__main__":
    main()
