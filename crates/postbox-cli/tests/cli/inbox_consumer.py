"""A consumer in another language: reads a Redis stream that `postbox relay` publishes to, through
a consumer group, and applies each message's effect (a row of `ledger`) once, with Postbox's SQL
inbox: the batch's postbox_inbox_receive calls and its effects are one PostgreSQL transaction,
committed before the entries are acknowledged. A crash before the commit leaves nothing, and the
entries are read again (the group's pending list); a crash after it leaves them unacknowledged,
and the repeats are skipped. Driven by crates/postbox-cli/tests/cli/inbox.rs, which kills it.

Run: python3 inbox_consumer.py <database url> <stream> <group>
"""

import sys

try:
    import psycopg
    import redis
except ImportError as e:
    print(f"inbox_consumer.py needs psycopg 3 and redis-py ({e}); run scripts/install-deps",
          file=sys.stderr)
    sys.exit(3)

CONSUMER = "ledger"
WORKER = "worker"


def main():
    if len(sys.argv) != 4:
        print("usage: inbox_consumer.py <database url> <stream> <group>", file=sys.stderr)
        sys.exit(2)
    url, stream, group = sys.argv[1:]
    r = redis.Redis(host="127.0.0.1", port=6379)
    try:
        r.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise
    conn = psycopg.connect(url, autocommit=True)
    # First what an earlier instance read and never acknowledged, then new entries.
    start = "0"
    while True:
        reply = r.xreadgroup(group, WORKER, {stream: start}, count=200, block=200)
        entries = reply[0][1] if reply else []
        if not entries:
            start = ">"
            continue
        with conn.transaction():
            for _, fields in entries:
                dedup_id = fields[b"postbox-dedup-id"].decode()
                new = conn.execute(
                    "SELECT postbox_inbox_receive(%s, %s)", (CONSUMER, dedup_id)
                ).fetchone()[0]
                if new:
                    conn.execute(
                        "INSERT INTO ledger (dedup_id, event_id) VALUES (%s, %s)",
                        (dedup_id, int(fields[b"postbox-event-id"])),
                    )
        r.xack(stream, group, *[entry_id for entry_id, _ in entries])


if __name__ == "__main__":
    main()
