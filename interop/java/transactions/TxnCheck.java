// The Java client's transactional producer against a broker (issue 12), run by
// crates/cli/tests/transactions.rs: commit and abort interleaved over the 3 partitions of a
// topic, offsets sent to the transaction (sendOffsetsToTransaction), read_committed and
// read_uncommitted consumers checked record by record, the committed offsets read back with
// requireStable, and a second producer with the same transactional id fencing the first.
// Prints one "ok ..." line per check; exits 1 with "FAIL ..." on the first mismatch.
//
//   javac -cp "$KAFKA_LIBS/*" -d /tmp/txn TxnCheck.java
//   java -cp "$KAFKA_LIBS/*:/tmp/txn" TxnCheck <bootstrap> <topic> <group>
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class TxnCheck {
    static void fail(String msg) {
        System.out.println("FAIL " + msg);
        System.out.flush();
        System.exit(1);
    }

    static KafkaProducer<String, String> producer(String bootstrap, String txnId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "30000");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "60000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return new KafkaProducer<>(p);
    }

    static List<String> readAll(String bootstrap, String topic, String isolation) {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        List<String> out = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int p = 0; p < 3; p++) tps.add(new TopicPartition(topic, p));
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            // For read_committed the end offsets are the last stable offsets.
            Map<TopicPartition, Long> end = consumer.endOffsets(tps);
            long deadline = System.currentTimeMillis() + 60_000;
            while (System.currentTimeMillis() < deadline) {
                boolean done = true;
                for (TopicPartition tp : tps) if (consumer.position(tp) < end.get(tp)) done = false;
                if (done) break;
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) out.add(r.value());
            }
        }
        Collections.sort(out);
        return out;
    }

    static List<String> expected(String... prefixes) {
        List<String> out = new ArrayList<>();
        for (String prefix : prefixes) for (int i = 0; i < 30; i++) out.add(prefix + "-" + i);
        Collections.sort(out);
        return out;
    }

    static void send(KafkaProducer<String, String> p, String topic, String prefix) throws Exception {
        for (int i = 0; i < 30; i++) p.send(new ProducerRecord<>(topic, i % 3, "k" + i, prefix + "-" + i));
        p.flush();
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[2];
        String txnId = "txn-check-" + topic;
        KafkaProducer<String, String> p = producer(bootstrap, txnId);
        p.initTransactions();
        System.out.println("ok initTransactions");

        p.beginTransaction();
        send(p, topic, "c1");
        Map<TopicPartition, OffsetAndMetadata> offsets = Map.of(new TopicPartition(topic, 0), new OffsetAndMetadata(10));
        p.sendOffsetsToTransaction(offsets, new ConsumerGroupMetadata(group));
        p.commitTransaction();
        System.out.println("ok commit 1");

        p.beginTransaction();
        send(p, topic, "a2");
        p.sendOffsetsToTransaction(Map.of(new TopicPartition(topic, 0), new OffsetAndMetadata(20)), new ConsumerGroupMetadata(group));
        p.abortTransaction();
        System.out.println("ok abort 2");

        p.beginTransaction();
        send(p, topic, "c3");
        p.commitTransaction();
        System.out.println("ok commit 3");

        List<String> committed = readAll(bootstrap, topic, "read_committed");
        if (!committed.equals(expected("c1", "c3"))) fail("read_committed saw " + committed);
        System.out.println("ok read_committed " + committed.size());
        List<String> all = readAll(bootstrap, topic, "read_uncommitted");
        if (!all.equals(expected("a2", "c1", "c3"))) fail("read_uncommitted saw " + all);
        System.out.println("ok read_uncommitted " + all.size());

        Properties a = new Properties();
        a.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(a)) {
            Map<TopicPartition, OffsetAndMetadata> got = admin
                .listConsumerGroupOffsets(group, new ListConsumerGroupOffsetsOptions().requireStable(true))
                .partitionsToOffsetAndMetadata().get();
            OffsetAndMetadata o = got.get(new TopicPartition(topic, 0));
            if (o == null || o.offset() != 10) fail("committed offsets " + got);
            System.out.println("ok offsets " + o.offset());
        }

        // A second instance with the same transactional id fences the first.
        KafkaProducer<String, String> zombie = p;
        KafkaProducer<String, String> p2 = producer(bootstrap, txnId);
        p2.initTransactions();
        try {
            zombie.beginTransaction();
            zombie.send(new ProducerRecord<>(topic, 0, "z", "zombie")).get();
            zombie.commitTransaction();
            fail("the fenced producer committed");
        } catch (Exception e) {
            Throwable t = e;
            boolean fenced = false;
            while (t != null) {
                if (t instanceof ProducerFencedException || t instanceof InvalidProducerEpochException) fenced = true;
                t = t.getCause();
            }
            if (!fenced) fail("the zombie failed with " + e);
        }
        System.out.println("ok fenced");
        p2.beginTransaction();
        p2.send(new ProducerRecord<>(topic, 1, "n", "new")).get();
        p2.commitTransaction();
        p2.close();
        try { zombie.close(Duration.ofSeconds(1)); } catch (Exception ignored) { }
        List<String> last = readAll(bootstrap, topic, "read_committed");
        if (last.contains("zombie") || !last.contains("new")) fail("after fencing read_committed saw " + last);
        System.out.println("ok done");
    }
}
