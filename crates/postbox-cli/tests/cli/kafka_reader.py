"""Reads a Kafka topic from the beginning with kafka-python, a client not written here, and
prints every record as JSON: partition, offset, key, value and headers.

    kafka_reader.py BOOTSTRAP TOPIC EXPECTED TIMEOUT_SECONDS

Stops once it has read records of EXPECTED distinct `postbox-event-id`s, or after the timeout
(the test then names what is missing).
"""

import json
import sys
import time

from kafka import KafkaConsumer, TopicPartition


def main():
    bootstrap, topic, expected, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    deadline = time.monotonic() + timeout
    partitions = None
    while not partitions and time.monotonic() < deadline:
        partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise SystemExit(f"topic {topic} has no partitions on {bootstrap}")
    assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
    consumer.assign(assigned)
    consumer.seek_to_beginning(*assigned)
    records, seen = [], set()
    while len(seen) < expected and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            for r in batch:
                headers = {k: v.decode("utf-8") for k, v in (r.headers or [])}
                seen.add(headers.get("postbox-event-id"))
                records.append(
                    {
                        "partition": r.partition,
                        "offset": r.offset,
                        "key": r.key.decode("utf-8") if r.key is not None else None,
                        "value": r.value.decode("utf-8"),
                        "headers": headers,
                    }
                )
    consumer.close()
    json.dump(records, sys.stdout)


if __name__ == "__main__":
    main()
