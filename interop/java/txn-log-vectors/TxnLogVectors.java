// Prints the bytes Apache Kafka's own generated classes write for `__transaction_state`
// records (TransactionLogKey v0, TransactionLogValue v0 and v1 with tagged fields), as hex,
// for the test vectors of crates/coordinator/src/transaction/records.rs. Facts only.
//
//   javac -cp "$KAFKA_LIBS/*" -d /tmp/tlv TxnLogVectors.java
//   java -cp "$KAFKA_LIBS/*:/tmp/tlv" TxnLogVectors
import java.util.*;
import org.apache.kafka.common.protocol.MessageUtil;
import org.apache.kafka.coordinator.transaction.generated.TransactionLogKey;
import org.apache.kafka.coordinator.transaction.generated.TransactionLogValue;

public class TxnLogVectors {
    static String hex(byte[] b) {
        StringBuilder s = new StringBuilder();
        for (byte x : b) s.append(String.format("%02x", x));
        return s.toString();
    }

    static TransactionLogValue value(byte state, boolean partitions) {
        TransactionLogValue v = new TransactionLogValue()
            .setProducerId(4000L)
            .setProducerEpoch((short) 3)
            .setTransactionTimeoutMs(60000)
            .setTransactionStatus(state)
            .setTransactionLastUpdateTimestampMs(1700000000000L)
            .setTransactionStartTimestampMs(1699999999000L);
        if (partitions) {
            v.setTransactionPartitions(List.of(
                new TransactionLogValue.PartitionsSchema().setTopic("t").setPartitionIds(List.of(0, 2)),
                new TransactionLogValue.PartitionsSchema().setTopic("__consumer_offsets").setPartitionIds(List.of(49))));
        } else {
            v.setTransactionPartitions(null);
        }
        return v;
    }

    public static void main(String[] args) {
        System.out.println("key my-txn: " + hex(MessageUtil.toVersionPrefixedBytes((short) 0,
            new TransactionLogKey().setTransactionalId("my-txn"))));
        System.out.println("value v0 Ongoing: " + hex(MessageUtil.toVersionPrefixedBytes((short) 0, value((byte) 1, true))));
        System.out.println("value v0 Empty: " + hex(MessageUtil.toVersionPrefixedBytes((short) 0, value((byte) 0, false))));
        System.out.println("value v1 PrepareCommit tagged: " + hex(MessageUtil.toVersionPrefixedBytes((short) 1,
            value((byte) 2, true).setPreviousProducerId(7L).setNextProducerId(8L).setClientTransactionVersion((short) 2))));
        System.out.println("value v1 Empty: " + hex(MessageUtil.toVersionPrefixedBytes((short) 1, value((byte) 0, false))));
    }
}
