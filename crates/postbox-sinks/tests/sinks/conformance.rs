//! The sink conformance suite, run against every sink whose feature is on, plus each sink's own
//! edge cases.
//!
//! Needs the loopback services: NATS with JetStream on 4222, RabbitMQ on 5672 (guest/guest),
//! Redis on 6379, Mosquitto on 1883. Kafka runs twice: on librdkafka's mock cluster, and on a
//! real Kafka-protocol broker, a tansu process of the test's own (scripts/install-deps builds
//! it), which the test kills, restarts and stalls. The webhook runs on a server of the test's
//! own. "Broker down" never stops a shared service: each test puts a proxy of its own between its
//! sink and the broker and switches that off.

#![allow(clippy::unwrap_used, reason = "tests")]

/// Runs the shared suite against one harness.
macro_rules! conformance {
    ($module:ident, $feature:literal, $harness:ty, concurrency = $n:expr) => {
        #[cfg(feature = $feature)]
        mod $module {
            use crate::support;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delivers_exactly_what_was_acked() {
                support::delivers_exactly_what_was_acked::<$harness>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn recovers_after_the_broker_comes_back() {
                support::recovers_after_the_broker_comes_back::<$harness>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn no_success_without_an_acknowledgement() {
                support::no_success_without_an_acknowledgement::<$harness>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_publishes_are_all_delivered() {
                support::concurrent_publishes_are_all_delivered::<$harness>($n).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn publishes_to_a_destination_given_per_call() {
                support::publishes_to_a_destination_given_per_call::<$harness>().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn missing_template_value_is_permanent() {
                support::missing_template_value_is_permanent::<$harness>().await;
            }
        }
    };
}

conformance!(nats, "nats", support::nats::NatsHarness, concurrency = 100);
conformance!(amqp, "amqp", support::amqp::AmqpHarness, concurrency = 100);
conformance!(
    kafka,
    "kafka",
    support::kafka::KafkaHarness,
    concurrency = 100
);
conformance!(
    redis,
    "redis",
    support::redis::RedisHarness,
    concurrency = 100
);
conformance!(mqtt, "mqtt", support::mqtt::MqttHarness, concurrency = 200);
conformance!(
    webhook,
    "webhook",
    support::webhook::WebhookHarness,
    concurrency = 50
);

/// The Kafka sink on a real Kafka-protocol broker: tansu (see `postbox_testkit::tansu`), with
/// the producer as the relay runs it (`acks=all`, idempotent). The suite's connected cases run as
/// they are; the broker is then restarted and stalled in the middle of publishes, as short as a
/// restart or a pause is in production, and nothing acknowledged may be missing.
///
/// The suite's two outage cases (a publish made while the broker is away or stalled fails
/// within its timeout) run only on the mock cluster: a message that times out makes the
/// idempotent producer bump its epoch (KIP-360), and tansu 0.6.0 cannot (its `InitProducerId`
/// with a producer id is a `todo!()`, and its storage stops answering). docs/sinks.md says so.
#[cfg(feature = "kafka")]
mod kafka_broker {
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::Duration;

    use postbox::{OutboxEvent, Sink};

    use crate::support;
    use crate::support::kafka::TansuHarness;
    use crate::support::{Harness, full_event};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delivers_exactly_what_was_acked() {
        support::delivers_exactly_what_was_acked::<TansuHarness>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_publishes_are_all_delivered() {
        support::concurrent_publishes_are_all_delivered::<TansuHarness>(100).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn publishes_to_a_destination_given_per_call() {
        support::publishes_to_a_destination_given_per_call::<TansuHarness>().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn missing_template_value_is_permanent() {
        support::missing_template_value_is_permanent::<TansuHarness>().await;
    }

    /// Publishes `events` 8 at a time, each until it is acknowledged (as the relay retries an
    /// event), running `fault` once a third are acknowledged; then every event must arrive.
    async fn publish_through<F>(h: Arc<TansuHarness>, events: Vec<OutboxEvent>, fault: F)
    where
        F: AsyncFnOnce(&TansuHarness),
    {
        let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let queue = Arc::new(std::sync::Mutex::new(events.clone()));
        let mut workers = Vec::new();
        for _ in 0..8 {
            let (h, queue, acked) = (h.clone(), queue.clone(), acked.clone());
            workers.push(tokio::spawn(async move {
                loop {
                    let Some(event) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    let mut tries = 0;
                    while let Err(e) = h.sink.publish(&event).await {
                        tries += 1;
                        assert!(tries < 20, "event {} never acknowledged: {e}", event.id);
                        // The relay's backoff between two tries of an event, shortened: the
                        // subject is a publisher that retries as the relay does.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }));
        }
        postbox_testkit::wait_until(
            "a third of the events are acknowledged, before the fault",
            Duration::from_secs(60),
            || async { acked.load(std::sync::atomic::Ordering::SeqCst) >= events.len() / 3 },
        )
        .await;
        fault(&h).await;
        for worker in workers {
            worker.await.unwrap();
        }
        let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
        let got = h
            .collector()
            .wait_for_ids(&ids, Duration::from_secs(30))
            .await;
        let seen: HashSet<i64> = got.iter().filter_map(|r| r.event_id()).collect();
        let missing: Vec<&i64> = ids.iter().filter(|id| !seen.contains(id)).collect();
        assert!(missing.is_empty(), "acknowledged, never read: {missing:?}");
        for r in &got {
            assert!(r.header("postbox-dedup-id").is_some(), "no dedup id: {r:?}");
        }
    }

    /// The broker killed (`SIGKILL`) and started again while 8 publishes are in flight: the
    /// producer reconnects and sends again what had no answer; every event arrives.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broker_restarted_mid_publish_loses_nothing() {
        let h = Arc::new(TansuHarness::start(Duration::from_secs(5)).await);
        let events: Vec<OutboxEvent> = (0..300).map(|_| full_event()).collect();
        publish_through(h.clone(), events, async |h: &TansuHarness| {
            h.broker_down().await;
            h.broker_up().await;
        })
        .await;
    }

    /// The broker stopped (`SIGSTOP`) for a second while publishes are in flight, shorter than
    /// the publish timeout: the publishes wait for it, and every event arrives.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broker_stalled_for_a_second_delays_publishes_and_loses_nothing() {
        let h = Arc::new(TansuHarness::start(Duration::from_secs(5)).await);
        let events: Vec<OutboxEvent> = (0..300).map(|_| full_event()).collect();
        publish_through(h.clone(), events, async |h: &TansuHarness| {
            h.stall_acks().await;
            // The stall itself: a broker that answers nothing for a second.
            tokio::time::sleep(Duration::from_secs(1)).await;
            h.broker_up().await;
        })
        .await;
    }
}

#[cfg(feature = "nats")]
mod nats_specific {
    use std::time::Duration;

    use postbox::Sink;

    use crate::support::nats::NatsHarness;
    use crate::support::proxy::Proxy;
    use crate::support::{Harness, full_event};

    /// JetStream drops a repeat of the same `Nats-Msg-Id`; both publishes are acknowledged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repeat_is_acked_and_stored_once() {
        let h = NatsHarness::start(Duration::from_secs(5)).await;
        let event = full_event();
        h.sink.publish(&event).await.unwrap();
        h.sink.publish(&event).await.unwrap();
        h.collector().wait_for(1, Duration::from_secs(5)).await;
        assert_eq!(h.message_count().await, 1);
        h.cleanup().await;
    }

    /// A subject no stream captures fails as retryable and says so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_stream_for_the_subject_is_an_error() {
        let proxy = Proxy::start(crate::support::nats::SERVER.parse().unwrap()).await;
        let prefix = format!("postbox_nostream_{}", crate::support::suffix());
        let sink = postbox_sinks::NatsSink::connect(NatsHarness::config(
            &prefix,
            &proxy,
            Duration::from_secs(3),
        ))
        .await
        .unwrap();
        let err = sink.publish(&full_event()).await.unwrap_err();
        assert!(!err.is_permanent(), "{err}");
        assert!(err.to_string().contains("stream"), "{err}");
    }

    /// `connect` fails with the address when nothing listens there.
    #[tokio::test]
    async fn connect_fails_when_unreachable() {
        let proxy = Proxy::start(crate::support::nats::SERVER.parse().unwrap()).await;
        proxy.down();
        let mut config = NatsHarness::config("x", &proxy, Duration::from_secs(1));
        config.connect_timeout = Duration::from_secs(1);
        let err = postbox_sinks::NatsSink::connect(config).await.unwrap_err();
        assert!(err.to_string().contains(&proxy.port().to_string()), "{err}");
    }
}

#[cfg(feature = "amqp")]
mod amqp_specific {
    use std::time::Duration;

    use lapin::options::ExchangeDeleteOptions;
    use postbox::Sink;

    use crate::support::amqp::{admin, declare_exchange, sink_config};
    use crate::support::proxy::Proxy;
    use crate::support::{full_event, suffix};

    /// With `mandatory`, a message no queue receives is returned: the publish fails (retryable).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unroutable_message_is_an_error() {
        let (connection, channel) = admin().await;
        let exchange = format!("postbox_test_unbound_{}", suffix());
        declare_exchange(&channel, &exchange).await;
        let proxy = Proxy::start(crate::support::amqp::BROKER.parse().unwrap()).await;
        let sink = postbox_sinks::AmqpSink::connect(sink_config(
            &proxy,
            &exchange,
            Duration::from_secs(5),
        ))
        .await
        .unwrap();
        let err = sink.publish(&full_event()).await.unwrap_err();
        assert!(!err.is_permanent(), "{err}");
        assert!(err.to_string().contains("no queue is bound"), "{err}");
        let _ = channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await;
        let _ = connection.close(200, "done".into()).await;
    }

    /// A missing exchange closes the channel; the publish fails (retryable) and the sink opens a
    /// new channel for the next one, which succeeds once the exchange exists.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn missing_exchange_fails_then_recovers() {
        let exchange = format!("postbox_test_missing_{}", suffix());
        let proxy = Proxy::start(crate::support::amqp::BROKER.parse().unwrap()).await;
        let sink = postbox_sinks::AmqpSink::connect(sink_config(
            &proxy,
            &exchange,
            Duration::from_secs(3),
        ))
        .await
        .unwrap();
        let err = sink.publish(&full_event()).await.unwrap_err();
        assert!(!err.is_permanent(), "{err}");

        let (connection, channel) = admin().await;
        declare_exchange(&channel, &exchange).await;
        let queue = exchange.clone();
        channel
            .queue_declare(
                queue.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    auto_delete: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "#".into(),
                Default::default(),
                lapin::types::FieldTable::default(),
            )
            .await
            .unwrap();
        sink.publish(&full_event()).await.unwrap();
        let _ = channel
            .queue_delete(queue.as_str().into(), Default::default())
            .await;
        let _ = channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await;
        let _ = connection.close(200, "done".into()).await;
    }
}

#[cfg(feature = "kafka")]
mod kafka_specific {
    use std::time::Duration;

    use postbox::Sink;
    use rdkafka::types::RDKafkaRespErr;

    use crate::support::kafka::{Command, KafkaHarness};
    use crate::support::{Harness, full_event};

    /// A broker error that retrying cannot fix (message too large) is permanent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn message_too_large_is_permanent() {
        let h = KafkaHarness::start(Duration::from_secs(5)).await;
        h.mock.command(Command::ProduceErrors(vec![
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
        ]));
        let err = h.sink.publish(&full_event()).await.unwrap_err();
        assert!(err.is_permanent(), "{err}");
        h.cleanup().await;
    }

    /// A transient broker error (not enough replicas) is retried inside the producer and the
    /// publish still succeeds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transient_broker_errors_are_retried_by_the_producer() {
        let h = KafkaHarness::start(Duration::from_secs(5)).await;
        h.mock.command(Command::ProduceErrors(vec![
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
        ]));
        let event = full_event();
        h.sink.publish(&event).await.unwrap();
        let got = h
            .collector()
            .wait_for_ids(&[event.id], Duration::from_secs(10))
            .await;
        assert_eq!(
            got.len(),
            1,
            "idempotent producer: no duplicate from its retries"
        );
        h.cleanup().await;
    }
}

#[cfg(feature = "redis")]
mod redis_specific {
    use std::time::Duration;

    use postbox::Sink;
    use redis::AsyncCommands;

    use crate::support::proxy::Proxy;
    use crate::support::redis::{admin, sink_config};
    use crate::support::{full_event, suffix};

    /// A key that holds something else than a stream is a permanent error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wrong_type_is_permanent() {
        let mut conn = admin().await;
        let key = format!("postbox_test_wrongtype_{}", suffix());
        let _: () = conn.set(&key, "a string").await.unwrap();
        let proxy = Proxy::start(crate::support::redis::SERVER.parse().unwrap()).await;
        let sink =
            postbox_sinks::RedisSink::connect(sink_config(&proxy, &key, Duration::from_secs(3)))
                .await
                .unwrap();
        let err = sink.publish(&full_event()).await.unwrap_err();
        assert!(err.is_permanent(), "{err}");
        let _: () = conn.del(&key).await.unwrap();
    }

    /// `maxlen` trims the stream (approximately).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn maxlen_trims_the_stream() {
        let mut conn = admin().await;
        let key = format!("postbox_test_maxlen_{}", suffix());
        let proxy = Proxy::start(crate::support::redis::SERVER.parse().unwrap()).await;
        let mut config = sink_config(&proxy, &key, Duration::from_secs(5));
        config.maxlen = Some(10);
        let sink = postbox_sinks::RedisSink::connect(config).await.unwrap();
        for _ in 0..300 {
            sink.publish(&full_event()).await.unwrap();
        }
        let len: u64 = conn.xlen(&key).await.unwrap();
        assert!((10..300).contains(&len), "stream length {len}");
        let _: () = conn.del(&key).await.unwrap();
    }
}

#[cfg(feature = "mqtt")]
mod mqtt_specific {
    use std::time::Duration;

    use postbox::Sink;

    use crate::support::mqtt::MqttHarness;
    use crate::support::{Harness, full_event};

    /// Publishes made while the broker is away all fail (none claims success); after it comes
    /// back, a new burst of 200 is acknowledged and received in full.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn publishes_while_down_all_fail_and_a_new_burst_succeeds() {
        let h = MqttHarness::start(Duration::from_secs(3)).await;
        h.proxy.down();
        let during: Vec<_> = (0..50).map(|_| full_event()).collect();
        let results = futures::future::join_all(during.iter().map(|e| h.sink.publish(e))).await;
        assert!(
            results.iter().all(Result::is_err),
            "no publish claims success while down"
        );
        h.proxy.up();
        let after: Vec<_> = (0..200).map(|_| full_event()).collect();
        let results = futures::future::join_all(after.iter().map(|e| h.sink.publish(e))).await;
        for r in results {
            r.unwrap();
        }
        let ids: Vec<i64> = after.iter().map(|e| e.id).collect();
        let got = h
            .collector()
            .wait_for_ids(&ids, Duration::from_secs(20))
            .await;
        let seen: std::collections::HashSet<i64> =
            got.iter().filter_map(|r| r.event_id()).collect();
        assert!(ids.iter().all(|id| seen.contains(id)));
        h.cleanup().await;
    }

    /// The broker drops the connection in the middle of a burst; publishes whose PUBACK was lost
    /// are sent again on the new connection, every publish ends (ok or a retryable error) within
    /// its timeout, and every acknowledged one was received.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_mid_burst_loses_no_acknowledged_event() {
        let h = MqttHarness::start(Duration::from_secs(4)).await;
        let events: Vec<_> = (0..300).map(|_| full_event()).collect();
        let publishes = futures::future::join_all(events.iter().map(|e| h.sink.publish(e)));
        let restart = async {
            // Once the burst is under way.
            h.collector().wait_for(50, Duration::from_secs(5)).await;
            h.proxy.down();
            // The subject: the broker is away for 200 ms in the middle of the burst.
            tokio::time::sleep(Duration::from_millis(200)).await;
            h.proxy.up();
        };
        let (results, ()) = tokio::join!(publishes, restart);
        let acked: Vec<i64> = events
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(e, _)| e.id)
            .collect();
        for r in &results {
            if let Err(e) = r {
                assert!(!e.is_permanent(), "{e}");
            }
        }
        let got = h
            .collector()
            .wait_for_ids(&acked, Duration::from_secs(20))
            .await;
        let seen: std::collections::HashSet<i64> =
            got.iter().filter_map(|r| r.event_id()).collect();
        let lost: Vec<_> = acked.iter().filter(|id| !seen.contains(id)).collect();
        assert!(lost.is_empty(), "acknowledged but never received: {lost:?}");
        h.cleanup().await;
    }
}

#[cfg(feature = "webhook")]
mod webhook_specific {
    use std::time::{Duration, Instant};

    use postbox::Sink;

    use crate::support::webhook::WebhookHarness;
    use crate::support::{Harness, full_event};

    async fn answer(status: u16, body: &str) -> postbox::PublishError {
        let h = WebhookHarness::start(Duration::from_secs(3)).await;
        h.endpoint.answer(status, body);
        let err = h.sink.publish(&full_event()).await.unwrap_err();
        h.cleanup().await;
        err
    }

    #[tokio::test]
    async fn bad_request_is_permanent_with_status_and_body() {
        let err = answer(400, "amount_cents must be positive").await;
        assert!(err.is_permanent(), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("400") && text.contains("amount_cents must be positive"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn long_error_bodies_are_truncated() {
        let err = answer(422, &"x".repeat(10_000)).await;
        assert!(err.is_permanent());
        assert!(err.to_string().len() < 1_000, "{}", err.to_string().len());
    }

    #[tokio::test]
    async fn unavailable_throttled_and_timeout_answers_are_retryable() {
        for status in [503, 500, 429, 408] {
            let err = answer(status, "later").await;
            assert!(!err.is_permanent(), "{status}: {err}");
            assert!(err.to_string().contains(&status.to_string()), "{err}");
        }
    }

    #[tokio::test]
    async fn redirects_are_not_followed_and_permanent() {
        let err = answer(301, "").await;
        assert!(err.is_permanent(), "{err}");
    }

    #[tokio::test]
    async fn a_slow_endpoint_times_out_as_retryable() {
        let h = WebhookHarness::start(Duration::from_millis(500)).await;
        h.endpoint
            .answer_after(200, "too late", Duration::from_secs(3));
        let started = Instant::now();
        let err = h.sink.publish(&full_event()).await.unwrap_err();
        assert!(!err.is_permanent(), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        h.cleanup().await;
    }

    #[tokio::test]
    async fn url_placeholders_are_percent_encoded() {
        let h = WebhookHarness::start(Duration::from_secs(3)).await;
        let mut event = full_event();
        event.event_type = "Invoice Created/v2".into();
        h.sink.publish(&event).await.unwrap();
        let got = h.collector().wait_for(1, Duration::from_secs(3)).await;
        assert_eq!(got[0].destination, "/hooks/Invoice/Invoice%20Created%2Fv2");
        h.cleanup().await;
    }
}
