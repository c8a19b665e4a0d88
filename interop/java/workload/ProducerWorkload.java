// The Java client's side of the fault tests (gregor_tests::chaos): an idempotent acks=all
// KafkaProducer driven through stdin/stdout, so the Rust test records every send's outcome.
//
// Usage: java -cp <kafka libs/*>:<dir> ProducerWorkload <bootstrap> <topic> <delivery.timeout.ms>
// stdin, one line per record:   <partition> <value>
// stdout, one line per outcome: ack <value> <partition> <offset>
//                               err <value> <exception class> <message on one line>
// and "ready" once the producer exists, "closed" after stdin ends and every send completed.
// Values must not contain spaces or newlines (the test's values are like j-123).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public final class ProducerWorkload {
    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: ProducerWorkload <bootstrap> <topic> <delivery.timeout.ms>");
            System.exit(2);
        }
        String topic = args[1];
        int deliveryTimeout = Integer.parseInt(args[2]);
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, Integer.toString(deliveryTimeout));
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, Integer.toString(Math.min(deliveryTimeout - 5, 5000)));
        // send() blocks for metadata at most this long; the test counts such a record unknown.
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, Integer.toString(deliveryTimeout));
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            synchronized (out) {
                out.println("ready");
                out.flush();
            }
            String line;
            while ((line = in.readLine()) != null) {
                int sp = line.indexOf(' ');
                if (sp < 0) {
                    continue;
                }
                int partition = Integer.parseInt(line.substring(0, sp));
                String value = line.substring(sp + 1);
                try {
                    producer.send(new ProducerRecord<>(topic, partition, null, value), (md, e) -> {
                        synchronized (out) {
                            if (e == null) {
                                out.println("ack " + value + " " + md.partition() + " " + md.offset());
                            } else {
                                out.println("err " + value + " " + e.getClass().getSimpleName() + " " + oneLine(e));
                            }
                            out.flush();
                        }
                    });
                } catch (Exception e) {
                    synchronized (out) {
                        out.println("err " + value + " " + e.getClass().getSimpleName() + " " + oneLine(e));
                        out.flush();
                    }
                }
            }
            producer.flush();
        }
        synchronized (out) {
            out.println("closed");
            out.flush();
        }
    }

    private static String oneLine(Throwable e) {
        String m = String.valueOf(e.getMessage());
        return m.replace('\n', ' ').replace('\r', ' ');
    }
}
