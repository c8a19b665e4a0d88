import java.io.File;
import java.io.IOException;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.Stream;

import org.apache.kafka.common.Endpoint;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.record.internal.FileLogInputStream.FileChannelRecordBatch;
import org.apache.kafka.common.record.internal.FileRecords;
import org.apache.kafka.common.utils.internals.BufferSupplier;
import org.apache.kafka.common.utils.internals.LogContext;
import org.apache.kafka.image.MetadataDelta;
import org.apache.kafka.image.MetadataImage;
import org.apache.kafka.image.TopicImage;
import org.apache.kafka.image.loader.LoaderManifest;
import org.apache.kafka.image.loader.MetadataLoader;
import org.apache.kafka.image.node.MetadataImageNode;
import org.apache.kafka.image.node.MetadataNode;
import org.apache.kafka.image.node.printer.MetadataNodePrinter;
import org.apache.kafka.image.node.printer.MetadataNodeRedactionCriteria;
import org.apache.kafka.image.publisher.MetadataPublisher;
import org.apache.kafka.metadata.BrokerRegistration;
import org.apache.kafka.metadata.ControllerRegistration;
import org.apache.kafka.metadata.MetadataRecordSerde;
import org.apache.kafka.metadata.PartitionRegistration;
import org.apache.kafka.metadata.VersionRange;
import org.apache.kafka.metadata.util.SnapshotFileReader;
import org.apache.kafka.raft.internals.RecordsBatchReader;
import org.apache.kafka.raft.internals.RecordsIterator;
import org.apache.kafka.server.common.ApiMessageAndVersion;
import org.apache.kafka.server.fault.FaultHandler;
import org.apache.kafka.server.fault.FaultHandlerException;
import org.apache.kafka.server.util.FileLock;
import org.apache.kafka.snapshot.FileRawSnapshotReader;
import org.apache.kafka.snapshot.RecordsSnapshotReader;
import org.apache.kafka.snapshot.SnapshotPath;
import org.apache.kafka.snapshot.Snapshots;

/**
 * Loads a KRaft metadata log or snapshot with Apache Kafka's own loader classes (the ones
 * {@code kafka-metadata-shell} uses: {@link MetadataLoader} fed by {@link SnapshotFileReader},
 * or by Kafka's Raft readers as a restarting node feeds it) and prints the resulting
 * {@link MetadataImage} as stable, sorted text. gregor's tests run it against gregor's
 * {@code __cluster_metadata-0} (see crates/cli/tests/metadata_shell.rs); the
 * {@code kafka-shell} artifact itself is not on Maven Central.
 *
 * <pre>
 * MetadataImageDump [--tree PATH] INPUT...
 *   --snapshot FILE  one .checkpoint or .log file, read as kafka-metadata-shell --snapshot reads it
 *                    (SnapshotFileReader: every batch of the file, in order)
 *   --dir DIR        a __cluster_metadata-0 directory read as a restarting node reads it: the
 *                    latest snapshot (handleLoadSnapshot; the bootstrap checkpoint 0-0 is not
 *                    loaded, as KafkaRaftClient hands it to handleLoadBootstrap), then every
 *                    log batch after it (handleCommit), CRCs checked. Everything on disk counts
 *                    as committed: a node's uncommitted tail is read too
 *   --log DIR        every log segment of DIR from offset 0, ignoring snapshots
 *   --tree PATH      instead of the summary, print the node PATH of the image the way the shell's
 *                    "tree" command does (e.g. /image/topics/byName; "/" is /image)
 * </pre>
 *
 * Each input prints a line "# input: KIND PATH (offset O, epoch E)" and then its summary. Exit
 * status 0 when every input loaded without a fault; 2 when a record could not be read,
 * Kafka's loader reported a fault, the image did not reach the last record within
 * LOAD_TIMEOUT_MS, or the directory's .lock is held by a Kafka process (the reason is printed
 * to stderr); 1 on bad arguments. Like the shell, it takes the log directory's .lock (a Java
 * FileLock, fcntl on Linux) when the file exists.
 */
public final class MetadataImageDump {
    /** How long one input may take to load before the run fails (ms). */
    private static final long LOAD_TIMEOUT_MS = 20_000;
    /** KafkaRaftClient's read size for its log and snapshot readers (8 MiB). */
    private static final int MAX_BATCH_SIZE_BYTES = 8 * 1024 * 1024;

    private MetadataImageDump() {
    }

    public static void main(String[] args) {
        String tree = null;
        List<String[]> inputs = new ArrayList<>();
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (i + 1 >= args.length) {
                usage("missing a value after " + a);
            }
            switch (a) {
                case "--tree":
                    tree = args[++i];
                    break;
                case "--snapshot":
                case "--dir":
                case "--log":
                    inputs.add(new String[] {a.substring(2), args[++i]});
                    break;
                default:
                    usage("unknown argument " + a);
            }
        }
        if (inputs.isEmpty()) {
            usage("no input");
        }
        PrintWriter out = new PrintWriter(System.out, false, StandardCharsets.UTF_8);
        int status = 0;
        for (String[] input : inputs) {
            try {
                Loaded loaded = load(input[0], Paths.get(input[1]));
                out.printf("# input: %s %s (offset %d, epoch %d)%n", input[0], input[1],
                    loaded.image.provenance().lastContainedOffset(),
                    loaded.image.provenance().lastContainedEpoch());
                if (tree != null) {
                    printTree(loaded.image, tree, out);
                } else {
                    summary(loaded.image, out);
                }
            } catch (Throwable e) {
                out.flush();
                System.err.println("error: " + input[0] + " " + input[1] + ": " + e);
                for (Throwable c = e.getCause(); c != null; c = c.getCause()) {
                    System.err.println("  caused by: " + c);
                }
                status = 2;
            }
        }
        out.flush();
        // The loaders' event-queue threads are not daemons.
        System.exit(status);
    }

    private static void usage(String why) {
        System.err.println("error: " + why);
        System.err.println("usage: MetadataImageDump [--tree PATH] "
            + "(--snapshot FILE | --dir DIR | --log DIR)...");
        System.exit(1);
    }

    /** The image of one input. */
    private static final class Loaded {
        final MetadataImage image;

        Loaded(MetadataImage image) {
            this.image = image;
        }
    }

    /** Records every fault of Kafka's loader; the run fails if there was one. */
    private static final class RecordingFaultHandler implements FaultHandler {
        final List<String> faults = Collections.synchronizedList(new ArrayList<>());

        @Override
        public RuntimeException handleFault(String failureMessage, Throwable cause) {
            faults.add(failureMessage + (cause == null ? "" : ": " + cause));
            return new FaultHandlerException(failureMessage, cause);
        }
    }

    /** Keeps the newest image the loader published (as the shell's MetadataShellPublisher). */
    private static final class LatestImage implements MetadataPublisher {
        volatile MetadataImage image;

        @Override
        public String name() {
            return "MetadataImageDump";
        }

        @Override
        public void onMetadataUpdate(MetadataDelta delta, MetadataImage newImage,
                                     LoaderManifest manifest) {
            image = newImage;
        }

        @Override
        public void close() {
        }
    }

    private static Loaded load(String kind, Path path) throws Exception {
        RecordingFaultHandler faults = new RecordingFaultHandler();
        LatestImage latest = new LatestImage();
        List<AutoCloseable> open = new ArrayList<>();
        FileLock lock = null;
        try {
            // As the shell: take the log directory's lock when there is one, so that a running
            // node's directory is not read while it changes.
            Path partitionDir = kind.equals("snapshot")
                ? path.toAbsolutePath().getParent() : path.toAbsolutePath();
            lock = lockLogDirIfLocked(partitionDir == null ? null : partitionDir.getParent());
            long expectedOffset;
            switch (kind) {
                case "snapshot": {
                    // Read the file as Kafka's Raft layer would (CRC, every record decoded): the
                    // shell's SnapshotFileReader only logs a record it cannot read and goes on.
                    FileSpan span = scan(path.toFile(), Long.MIN_VALUE, open);
                    expectedOffset = span.lastDataOffset;
                    if (expectedOffset < 0) {
                        throw new IOException("no metadata record in " + path);
                    }
                    validate(span);
                    // Then load it as the shell does: SnapshotFileReader feeding the loader, whose
                    // high watermark is the reader's (known once the file is read).
                    SnapshotFileReader[] reader = {null};
                    MetadataLoader loader = new MetadataLoader.Builder()
                        .setFaultHandler(faults)
                        .setNodeId(-1)
                        .setHighWaterMarkAccessor(() -> reader[0] == null
                            ? OptionalLong.empty() : reader[0].highWaterMark())
                        .build();
                    open.add(0, loader);
                    reader[0] = new SnapshotFileReader(path.toString(), loader);
                    open.add(0, reader[0]);
                    reader[0].startup();
                    loader.installPublishers(List.of(latest)).get(LOAD_TIMEOUT_MS,
                        TimeUnit.MILLISECONDS);
                    break;
                }
                case "dir":
                case "log": {
                    // The bootstrap checkpoint (0-0) goes to handleLoadBootstrap, which the
                    // loader ignores: the active controller writes its records into the log.
                    Optional<SnapshotPath> snapshot = kind.equals("dir")
                        ? latestSnapshot(path).filter(s ->
                            !s.snapshotId().equals(Snapshots.BOOTSTRAP_SNAPSHOT_ID))
                        : Optional.empty();
                    long start = snapshot.map(s -> s.snapshotId().offset()).orElse(0L);
                    List<FileSpan> spans = new ArrayList<>();
                    for (File segment : segments(path)) {
                        spans.add(scan(segment, start, open));
                    }
                    if (snapshot.isEmpty() && (spans.isEmpty() || spans.get(0).firstBaseOffset != 0)) {
                        throw new IOException("the log of " + path + " does not start at offset 0 "
                            + "(cleaned up to a snapshot?) and no snapshot is read");
                    }
                    expectedOffset = snapshot.map(s -> s.snapshotId().offset() - 1).orElse(-1L);
                    for (FileSpan s : spans) {
                        if (s.firstBaseOffset != Long.MIN_VALUE && s.firstBaseOffset < start) {
                            throw new IOException("a batch of " + s.file + " spans the snapshot's "
                                + "end offset " + start + " (it starts at " + s.firstBaseOffset
                                + ")");
                        }
                        expectedOffset = Math.max(expectedOffset, s.lastDataOffset);
                    }
                    if (expectedOffset < 0) {
                        throw new IOException("no metadata record in " + path);
                    }
                    // As KafkaRaftClient feeds a restarting node's loader: the snapshot, then the
                    // committed log after it; everything on disk counts as committed here.
                    long highWatermark = expectedOffset + 1;
                    MetadataLoader loader = new MetadataLoader.Builder()
                        .setFaultHandler(faults)
                        .setNodeId(-1)
                        .setHighWaterMarkAccessor(() -> OptionalLong.of(highWatermark))
                        .build();
                    open.add(0, loader);
                    loader.installPublishers(List.of(latest)).get(LOAD_TIMEOUT_MS,
                        TimeUnit.MILLISECONDS);
                    if (snapshot.isPresent()) {
                        FileRawSnapshotReader raw = FileRawSnapshotReader.open(path,
                            snapshot.get().snapshotId());
                        open.add(raw);
                        loader.handleLoadSnapshot(RecordsSnapshotReader.of(raw,
                            MetadataRecordSerde.INSTANCE, BufferSupplier.create(),
                            MAX_BATCH_SIZE_BYTES, true, new LogContext("[snapshot] ")));
                    }
                    for (FileSpan s : spans) {
                        if (s.firstBaseOffset == Long.MIN_VALUE) {
                            continue;
                        }
                        loader.handleCommit(RecordsBatchReader.of(s.firstBaseOffset,
                            s.records.slice(s.firstPosition,
                                s.records.sizeInBytes() - s.firstPosition),
                            MetadataRecordSerde.INSTANCE, BufferSupplier.create(),
                            MAX_BATCH_SIZE_BYTES, r -> { }, true,
                            new LogContext("[" + s.file.getName() + "] ")));
                    }
                    break;
                }
                default:
                    throw new IllegalArgumentException(kind);
            }
            long deadline = System.currentTimeMillis() + LOAD_TIMEOUT_MS;
            while (true) {
                if (!faults.faults.isEmpty()) {
                    throw new IOException("Kafka's MetadataLoader reported a fault: "
                        + String.join("; ", faults.faults));
                }
                MetadataImage image = latest.image;
                if (image != null && image.provenance().lastContainedOffset() >= expectedOffset) {
                    return new Loaded(image);
                }
                if (System.currentTimeMillis() > deadline) {
                    throw new IOException("Kafka's MetadataLoader did not publish an image up to "
                        + "offset " + expectedOffset + " within " + LOAD_TIMEOUT_MS + " ms (last: "
                        + (image == null ? "none" : image.provenance()) + ")");
                }
                Thread.sleep(10);
            }
        } finally {
            for (AutoCloseable c : open) {
                try {
                    c.close();
                } catch (Exception e) {
                    // Closing after the image is taken; nothing depends on it.
                }
            }
            if (lock != null) {
                lock.destroy();
            }
        }
    }

    private static FileLock lockLogDirIfLocked(Path logDir) throws IOException {
        if (logDir == null || !Files.exists(logDir.resolve(".lock"))) {
            return null;
        }
        FileLock lock = new FileLock(logDir.resolve(".lock").toFile());
        if (!lock.tryLock()) {
            lock.destroy();
            throw new IOException("Unable to lock " + logDir.toAbsolutePath()
                + ": a broker or controller is using it");
        }
        return lock;
    }

    /** The newest complete snapshot of a partition directory, if any. */
    private static Optional<SnapshotPath> latestSnapshot(Path dir) throws IOException {
        try (Stream<Path> files = Files.list(dir)) {
            return files.map(Snapshots::parse)
                .flatMap(Optional::stream)
                .filter(s -> !s.partial() && !s.deleted())
                .max((a, b) -> a.snapshotId().compareTo(b.snapshotId()));
        }
    }

    private static List<File> segments(Path dir) throws IOException {
        try (Stream<Path> files = Files.list(dir)) {
            return files.filter(p -> p.getFileName().toString().matches("[0-9]{20}\\.log"))
                .sorted()
                .map(Path::toFile)
                .collect(Collectors.toList());
        }
    }

    /** One file's batches at or after an offset. */
    private static final class FileSpan {
        File file;
        FileRecords records;
        /** The base offset of the first batch at or after the start; MIN_VALUE if none. */
        long firstBaseOffset = Long.MIN_VALUE;
        int firstPosition;
        /** The last offset of the last batch that holds metadata records; -1 if none. */
        long lastDataOffset = -1;
    }

    /**
     * Opens {@code file} and finds its batches whose last offset is at or after {@code start}
     * (all of them for MIN_VALUE). A batch that starts before {@code start} and ends after it
     * is reported through {@code firstBaseOffset < start}.
     */
    private static FileSpan scan(File file, long start, List<AutoCloseable> open)
            throws IOException {
        FileSpan span = new FileSpan();
        span.file = file;
        span.records = FileRecords.open(file, false);
        open.add(span.records);
        for (FileChannelRecordBatch batch : span.records.batches()) {
            if (batch.lastOffset() < start) {
                continue;
            }
            if (span.firstBaseOffset == Long.MIN_VALUE) {
                span.firstBaseOffset = batch.baseOffset();
                span.firstPosition = batch.position();
            }
            if (!batch.isControlBatch()) {
                span.lastDataOffset = batch.lastOffset();
            }
        }
        return span;
    }

    /** Reads every batch of the span with Kafka's Raft record iterator (CRC checked). */
    private static void validate(FileSpan s) throws IOException {
        try (RecordsIterator<ApiMessageAndVersion> it = new RecordsIterator<>(s.records,
                MetadataRecordSerde.INSTANCE, BufferSupplier.create(), MAX_BATCH_SIZE_BYTES,
                true, new LogContext("[validate] "))) {
            while (it.hasNext()) {
                it.next();
            }
        } catch (RuntimeException e) {
            throw new IOException("Kafka's record reader rejects " + s.file, e);
        }
    }

    // ---- the summary ---------------------------------------------------------------------

    private static void summary(MetadataImage image, PrintWriter out) {
        out.println("features:");
        out.printf("  metadata.version=%s%n", image.features().metadataVersion()
            .map(v -> v.featureLevel() + " (" + v.version() + ")").orElse("none"));
        new TreeMap<>(image.features().finalizedVersions()).forEach((k, v) -> {
            if (!k.equals("metadata.version")) {
                out.printf("  %s=%d%n", k, v);
            }
        });

        out.println("brokers:");
        new TreeMap<>(image.cluster().brokers()).forEach((id, b) -> out.println("  " + broker(b)));
        out.println("controllers:");
        new TreeMap<>(image.cluster().controllers()).forEach((id, c) ->
            out.println("  " + controller(c)));

        out.println("topics:");
        TreeMap<String, TopicImage> topics = new TreeMap<>();
        image.topics().topicsByName().forEach(topics::put);
        for (TopicImage t : topics.values()) {
            out.printf("  %s id=%s partitions=%d%n", t.name(), t.id(), t.partitions().size());
            new TreeMap<>(t.partitions()).forEach((p, r) -> out.printf("    %d %s%n", p,
                partition(r)));
        }

        out.println("configs:");
        TreeMap<String, Map<String, String>> configs = new TreeMap<>();
        image.configs().resourceData().forEach((resource, data) ->
            configs.put(resource.type() + " \"" + resource.name() + "\"", data.data()));
        configs.forEach((resource, data) -> {
            out.println("  " + resource);
            new TreeMap<>(data).forEach((k, v) -> out.printf("    %s=%s%n", k, v));
        });

        out.printf("producer_ids: next=%d%n", image.producerIds().nextProducerId());

        out.println("acls:");
        image.acls().acls().values().stream().map(Object::toString).sorted()
            .forEach(a -> out.println("  " + a));
        out.println("client_quotas:");
        image.clientQuotas().entities().entrySet().stream()
            .map(e -> new TreeMap<>(e.getKey().entries()) + " " + new TreeMap<>(e.getValue().quotas()))
            .sorted().forEach(q -> out.println("  " + q));
        out.println("scram:");
        image.scram().mechanisms().forEach((mechanism, users) -> users.forEach((user, data) ->
            out.printf("  %s %s iterations=%d%n", mechanism.mechanismName(), user,
                data.iterations())));
        out.println("delegation_tokens:");
        new TreeMap<>(image.delegationTokens().tokens()).forEach((id, data) ->
            out.printf("  %s owner=%s%n", id, data.tokenInformation().ownerAsString()));
    }

    private static String broker(BrokerRegistration b) {
        return b.id() + " epoch=" + b.epoch() + " incarnation=" + b.incarnationId()
            + " fenced=" + b.fenced() + " in_controlled_shutdown=" + b.inControlledShutdown()
            + " rack=" + b.rack().orElse("-")
            + " listeners=" + endpoints(b.listeners())
            + " features=" + ranges(b.supportedFeatures())
            + " directories=" + b.directories().stream().map(Uuid::toString).sorted()
                .collect(Collectors.joining(",", "[", "]"));
    }

    private static String controller(ControllerRegistration c) {
        return c.id() + " incarnation=" + c.incarnationId() + " listeners="
            + endpoints(c.listeners()) + " features=" + ranges(c.supportedFeatures());
    }

    private static String endpoints(Map<String, Endpoint> listeners) {
        return new TreeMap<>(listeners).values().stream()
            .map(e -> e.listener() + "(" + e.securityProtocol() + ")://" + e.host() + ":" + e.port())
            .collect(Collectors.joining(",", "[", "]"));
    }

    private static String ranges(Map<String, VersionRange> features) {
        return new TreeMap<>(features).entrySet().stream()
            .map(e -> e.getKey() + ":" + e.getValue().min() + "-" + e.getValue().max())
            .collect(Collectors.joining(",", "[", "]"));
    }

    private static String partition(PartitionRegistration r) {
        return "leader=" + r.leader + " leader_epoch=" + r.leaderEpoch
            + " partition_epoch=" + r.partitionEpoch
            + " replicas=" + ints(r.replicas)
            + " isr=" + ints(r.isr)
            + " elr=" + ints(r.elr)
            + " last_known_elr=" + ints(r.lastKnownElr)
            + " adding=" + ints(r.addingReplicas)
            + " removing=" + ints(r.removingReplicas)
            + " leader_recovery=" + r.leaderRecoveryState
            + " directories=" + (r.directories == null ? "[]" : Arrays.stream(r.directories)
                .map(Uuid::toString).collect(Collectors.joining(",", "[", "]")));
    }

    /** "[1,2,3]": no spaces, so that every field of a line is one word. */
    private static String ints(int[] values) {
        return values == null ? "[]" : Arrays.stream(values).mapToObj(Integer::toString)
            .collect(Collectors.joining(",", "[", "]"));
    }

    // ---- the shell's tree view -----------------------------------------------------------

    private static void printTree(MetadataImage image, String path, PrintWriter out) {
        MetadataNode node = new MetadataImageNode(image);
        List<String> parts = Arrays.stream(path.split("/")).filter(s -> !s.isEmpty())
            .collect(Collectors.toList());
        if (!parts.isEmpty() && parts.get(0).equals(MetadataImageNode.NAME)) {
            parts = parts.subList(1, parts.size());
        }
        String name = MetadataImageNode.NAME;
        for (String part : parts) {
            MetadataNode child = node.isDirectory() ? node.child(part) : null;
            if (child == null) {
                out.println("tree: " + path + ": No such file or directory.");
                return;
            }
            node = child;
            name = part;
        }
        IndentingPrinter printer = new IndentingPrinter(out);
        if (node.isDirectory()) {
            printer.enterNode(name);
            node.print(printer);
            printer.leaveNode();
        } else {
            node.print(printer);
        }
    }

    /** Two spaces per level, "name:" for a directory; secrets are not redacted (as the shell). */
    private static final class IndentingPrinter implements MetadataNodePrinter {
        private final PrintWriter out;
        private int depth;

        IndentingPrinter(PrintWriter out) {
            this.out = out;
        }

        @Override
        public MetadataNodeRedactionCriteria redactionCriteria() {
            return MetadataNodeRedactionCriteria.Disabled.INSTANCE;
        }

        @Override
        public void enterNode(String name) {
            out.println("  ".repeat(depth) + name + ":");
            depth++;
        }

        @Override
        public void leaveNode() {
            depth--;
        }

        @Override
        public void output(String text) {
            out.println("  ".repeat(depth) + text);
        }
    }
}
