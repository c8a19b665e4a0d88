// Kafka Streams with processing.guarantee=exactly_once_v2 against a broker (issue 12), run by
// crates/cli/tests/streams_eos.rs. A word count over a known input; the test kills the `run`
// process with SIGKILL in the middle of its processing (several times), restarts it, and then
// `check` reads the output topic with read_committed: every word's counts must be exactly
// 1, 2, ..., N (each occurrence of the word in the input adds one; the state store cache is
// off, so every update is emitted), ending at the word's count in the input. A count emitted by
// a transaction that was aborted by the kill (and then emitted again after the restart) would
// show as a repeated or skipped number.
//
//   javac -cp "$KAFKA_LIBS/*" -d /tmp/wc WordCountEos.java
//   java -cp "$KAFKA_LIBS/*:/tmp/wc" WordCountEos produce <bootstrap> <input> <lines>
//   java -cp "$KAFKA_LIBS/*:/tmp/wc" WordCountEos run <bootstrap> <app-id> <input> <output>
//        <state-dir> <replication-factor> <delay-ms-per-line>
//   java -cp "$KAFKA_LIBS/*:/tmp/wc" WordCountEos check <bootstrap> <output> <lines>
//   java -cp "$KAFKA_LIBS/*:/tmp/wc" WordCountEos runempty <bootstrap> <app-id> <input> <output>
//        <state-dir> <replication-factor> <delay-ms-per-line>
//   java -cp "$KAFKA_LIBS/*:/tmp/wc" WordCountEos committed <bootstrap> <app-id> <input> <output>
//
// `runempty` is an application whose transactions commit no records: its topology drops every
// input line, so each commit of Streams is a transaction holding only the consumer offsets
// (AddOffsetsToTxn, TxnOffsetCommit, EndTxn). `committed` waits until the group's committed
// offsets, fetched as stable (require_stable, KIP-447), reach the input's end, then checks that
// the application's transactional ids committed transactions and that the output is empty
// (not even a transaction marker).
//
// `run` prints "state <STATE>" on every state change, "processed <n>" every 20 input lines
// and "counted <n>" every 20 counts sent to the output (both counted from the process's start); `produce` and `check` print "ok ..." lines, or
// "FAIL ..." and exit 1.
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsOptions;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

public class WordCountEos {
    static final String[] WORDS = {
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
        "juliett", "kilo", "lima", "mike"
    };

    static void fail(String msg) {
        System.out.println("FAIL " + msg);
        System.out.flush();
        System.exit(1);
    }

    /** Input line i: two to four words, deterministic. */
    static String line(int i) {
        int n = 2 + (i % 3);
        StringBuilder sb = new StringBuilder();
        for (int j = 0; j < n; j++) {
            if (j > 0) sb.append(' ');
            sb.append(WORDS[(i * 7 + j * 5 + (i / 13)) % WORDS.length]);
        }
        return sb.toString();
    }

    static Map<String, Long> expectedCounts(int lines) {
        Map<String, Long> counts = new TreeMap<>();
        for (int i = 0; i < lines; i++)
            for (String w : line(i).split(" ")) counts.merge(w, 1L, Long::sum);
        return counts;
    }

    static void produce(String bootstrap, String input, int lines) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < lines; i++)
                sent.add(producer.send(new ProducerRecord<>(input, "line-" + i, line(i))));
            producer.flush();
            Set<Integer> partitions = new TreeSet<>();
            for (java.util.concurrent.Future<RecordMetadata> f : sent) partitions.add(f.get().partition());
            System.out.println("ok produced " + lines + " lines to partitions " + partitions);
        }
    }

    static void run(String bootstrap, String appId, String input, String output, String stateDir,
            String replicationFactor, long delayMs) throws Exception {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, replicationFactor);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
        // Every update of a count is forwarded (no record cache), so the output holds every
        // count from 1 up.
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0");
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "500");
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // A killed member leaves the group when its session expires (the broker's minimum,
        // group.min.session.timeout.ms, is 6 s); the restarted one waits for that.
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), "6000");
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), "1500");

        // Counts are sent at once (no batching delay), so that a transaction that is open when
        // the test kills the process already has counts in the output topic's log.
        p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), "0");

        final long[] processed = {0};
        final long[] counted = {0};
        StreamsBuilder b = new StreamsBuilder();
        b.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .peek((k, v) -> {
                    processed[0]++;
                    if (processed[0] % 20 == 0) {
                        System.out.println("processed " + processed[0]);
                        System.out.flush();
                    }
                    if (delayMs > 0) {
                        try {
                            Thread.sleep(delayMs);
                        } catch (InterruptedException e) {
                            Thread.currentThread().interrupt();
                        }
                    }
                })
                .flatMapValues(v -> Arrays.asList(v.split(" ")))
                .groupBy((k, w) -> w, Grouped.with("words", Serdes.String(), Serdes.String()))
                // A persistent (RocksDB) store, Streams' default: with one, Streams keeps its
                // process id in the state directory, so a restart on the same directory has the
                // same transactional id and fences (and aborts) the killed run's transaction at
                // once, instead of its timeout.
                .count(Materialized.with(Serdes.String(), Serdes.Long()))
                .toStream()
                .peek((w, c) -> {
                    counted[0]++;
                    if (counted[0] % 20 == 0) {
                        System.out.println("counted " + counted[0]);
                        System.out.flush();
                    }
                })
                .mapValues(c -> Long.toString(c))
                .to(output, Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(b.build(), p);
        streams.setStateListener((now, before) -> {
            System.out.println("state " + now);
            System.out.flush();
        });
        streams.setUncaughtExceptionHandler(e -> {
            System.out.println("FAIL uncaught " + e);
            e.printStackTrace(System.out);
            System.out.flush();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(streams::close));
        streams.start();
        // Runs until killed (the test's SIGKILL, or SIGTERM at the end).
        while (true) {
            Thread.sleep(1000);
            KafkaStreams.State s = streams.state();
            if (s == KafkaStreams.State.ERROR || s == KafkaStreams.State.NOT_RUNNING) {
                fail("streams stopped in state " + s);
            }
        }
    }

    static void runEmpty(String bootstrap, String appId, String input, String output, String stateDir,
            String replicationFactor, long delayMs) throws Exception {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, replicationFactor);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "300");
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), "6000");
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), "1500");
        final long[] processed = {0};
        StreamsBuilder b = new StreamsBuilder();
        b.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .peek((k, v) -> {
                    processed[0]++;
                    if (processed[0] % 20 == 0) {
                        System.out.println("processed " + processed[0]);
                        System.out.flush();
                    }
                    if (delayMs > 0) {
                        try {
                            Thread.sleep(delayMs);
                        } catch (InterruptedException e) {
                            Thread.currentThread().interrupt();
                        }
                    }
                })
                .filter((k, v) -> false)
                .to(output, Produced.with(Serdes.String(), Serdes.String()));
        KafkaStreams streams = new KafkaStreams(b.build(), p);
        streams.setStateListener((now, before) -> {
            System.out.println("state " + now);
            System.out.flush();
        });
        streams.setUncaughtExceptionHandler(e -> {
            System.out.println("FAIL uncaught " + e);
            e.printStackTrace(System.out);
            System.out.flush();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(streams::close));
        streams.start();
        while (true) {
            Thread.sleep(1000);
            KafkaStreams.State s = streams.state();
            if (s == KafkaStreams.State.ERROR || s == KafkaStreams.State.NOT_RUNNING) {
                fail("streams stopped in state " + s);
            }
        }
    }

    static void committed(String bootstrap, String appId, String input, String output) throws Exception {
        Properties a = new Properties();
        a.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(a);
                KafkaConsumer<String, String> consumer = consumer(bootstrap, "read_uncommitted")) {
            List<TopicPartition> tps = partitions(consumer, input);
            Map<TopicPartition, Long> end = consumer.endOffsets(tps);
            long deadline = System.currentTimeMillis() + 120_000;
            Map<TopicPartition, Long> got = new TreeMap<>(Comparator.comparing(TopicPartition::toString));
            while (true) {
                got.clear();
                Map<TopicPartition, OffsetAndMetadata> offsets = admin
                        .listConsumerGroupOffsets(appId, new ListConsumerGroupOffsetsOptions().requireStable(true))
                        .partitionsToOffsetAndMetadata().get();
                for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets.entrySet())
                    if (e.getKey().topic().equals(input) && e.getValue() != null)
                        got.put(e.getKey(), e.getValue().offset());
                boolean done = true;
                for (TopicPartition tp : tps) if (!end.get(tp).equals(got.get(tp))) done = false;
                if (done) break;
                if (System.currentTimeMillis() > deadline)
                    fail("committed offsets " + got + " after 120 s, expected the input's end " + end);
                Thread.sleep(200);
            }
            System.out.println("ok committed offsets at the input's end: " + got);
            long committedTxns = 0;
            for (TransactionListing t : admin.listTransactions().all().get()) {
                if (!t.transactionalId().startsWith(appId)) continue;
                TransactionDescription d = admin.describeTransactions(List.of(t.transactionalId()))
                        .description(t.transactionalId()).get();
                System.out.println("transaction " + t.transactionalId() + " " + d.state()
                        + " producer epoch " + d.producerEpoch());
                if (d.state() == TransactionState.COMPLETE_COMMIT) committedTxns++;
                if (d.state() == TransactionState.ONGOING || d.state() == TransactionState.PREPARE_COMMIT
                        || d.state() == TransactionState.PREPARE_ABORT)
                    System.out.println("note " + t.transactionalId() + " is " + d.state());
            }
            if (committedTxns == 0) fail("no transactional id of " + appId + " has committed a transaction");
            System.out.println("ok " + committedTxns + " transactional ids of " + appId + " last committed");
            List<TopicPartition> outs = partitions(consumer, output);
            Map<TopicPartition, Long> outEnd = consumer.endOffsets(outs);
            for (Map.Entry<TopicPartition, Long> e : outEnd.entrySet())
                if (e.getValue() != 0L) fail("output " + e.getKey() + " ends at " + e.getValue() + ", expected an empty log");
            System.out.println("ok the output is empty: " + outEnd);
            System.out.println("ok done");
        }
    }

    static KafkaConsumer<String, String> consumer(String bootstrap, String isolation) {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        return new KafkaConsumer<>(c);
    }

    static List<TopicPartition> partitions(KafkaConsumer<String, String> consumer, String topic) {
        List<TopicPartition> tps = new ArrayList<>();
        consumer.partitionsFor(topic, Duration.ofSeconds(30))
                .forEach(info -> tps.add(new TopicPartition(topic, info.partition())));
        return tps;
    }

    /** Reads `topic` from the beginning up to the end offsets (for read_committed, the LSOs). */
    static List<ConsumerRecord<String, String>> readToEnd(String bootstrap, String topic, String isolation) {
        List<ConsumerRecord<String, String>> out = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = consumer(bootstrap, isolation)) {
            List<TopicPartition> tps = partitions(consumer, topic);
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> end = consumer.endOffsets(tps);
            long deadline = System.currentTimeMillis() + 60_000;
            while (true) {
                boolean done = true;
                for (TopicPartition tp : tps) if (consumer.position(tp) < end.get(tp)) done = false;
                if (done) break;
                if (System.currentTimeMillis() > deadline) fail("reading " + topic + " " + isolation + " timed out");
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) out.add(r);
            }
        }
        return out;
    }

    static void check(String bootstrap, String output, int lines) {
        Map<String, Long> expected = expectedCounts(lines);
        // Wait (boundedly) until the committed output holds every word's final count.
        long deadline = System.currentTimeMillis() + 180_000;
        List<ConsumerRecord<String, String>> committed;
        while (true) {
            committed = readToEnd(bootstrap, output, "read_committed");
            Map<String, Long> last = new TreeMap<>();
            for (ConsumerRecord<String, String> r : committed) last.put(r.key(), Long.parseLong(r.value()));
            if (last.equals(expected)) break;
            if (System.currentTimeMillis() > deadline)
                fail("final counts " + last + " after 180 s, expected " + expected);
        }
        Map<String, Long> previous = new TreeMap<>();
        for (ConsumerRecord<String, String> r : committed) {
            long count = Long.parseLong(r.value());
            long before = previous.getOrDefault(r.key(), 0L);
            if (count != before + 1)
                fail("word " + r.key() + ": count " + count + " at " + r.topic() + "-" + r.partition()
                        + "@" + r.offset() + " follows " + before + " (a lost, repeated or aborted update)");
            previous.put(r.key(), count);
        }
        long total = expected.values().stream().mapToLong(Long::longValue).sum();
        if (committed.size() != total) fail(committed.size() + " committed counts, expected " + total);
        System.out.println("ok " + committed.size() + " committed counts, every word 1.." + "N exact: " + expected);
        List<ConsumerRecord<String, String>> all = readToEnd(bootstrap, output, "read_uncommitted");
        System.out.println("ok read_uncommitted sees " + all.size() + " records, "
                + (all.size() - committed.size()) + " of them from aborted transactions");
        System.out.println("aborted " + (all.size() - committed.size()));
        System.out.println("ok done");
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) fail("usage: produce|run|check ...");
        switch (args[0]) {
            case "produce" -> produce(args[1], args[2], Integer.parseInt(args[3]));
            case "run" -> run(args[1], args[2], args[3], args[4], args[5], args[6], Long.parseLong(args[7]));
            case "check" -> check(args[1], args[2], Integer.parseInt(args[3]));
            case "runempty" -> runEmpty(args[1], args[2], args[3], args[4], args[5], args[6], Long.parseLong(args[7]));
            case "committed" -> committed(args[1], args[2], args[3], args[4]);
            default -> fail("unknown mode " + args[0]);
        }
    }
}
