#!/usr/bin/env bash
# Kafka's own command-line tools (Apache Kafka 4.x, run from the jars cached by
# `cargo xtask kafka fetch`) against the broker at $GREGOR_BOOTSTRAP:
#   kafka-topics --create/--list/--describe/--delete, kafka-console-producer (plain and gzip,
#   keys and headers), kafka-console-consumer --partition 0 --offset earliest --max-messages N,
#   kafka-get-offsets (latest and earliest), and kafka-dump-log --files on the broker's own
#   segment file under $GREGOR_LOG_DIR (gregor's on-disk format must be Kafka's).
# Run by `cargo xtask test` (which sets both variables); fails loudly on the first mismatch.
set -euo pipefail

: "${GREGOR_BOOTSTRAP:?GREGOR_BOOTSTRAP must be host:port of the broker under test}"
: "${GREGOR_LOG_DIR:?GREGOR_LOG_DIR must be the log.dirs of the broker}"
B="$GREGOR_BOOTSTRAP"
# `cargo xtask test` passes its own binary in XTASK to skip a cargo round trip per tool.
read -r -a XTASK_CMD <<<"${XTASK:-cargo xtask}"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

kafka() { "${XTASK_CMD[@]}" kafka run "$@"; }
step() { printf '\n--- %s\n' "$*"; }
fail() {
    printf 'FAIL: %s\n' "$*" >&2
    exit 1
}
# expect_line FILE LINE: FILE has LINE as a whole line.
expect_line() { grep -qxF -- "$2" "$1" || { echo "---- $1:"; cat "$1"; fail "expected the line '$2'"; }; }
expect_match() { grep -qE -- "$2" "$1" || { echo "---- $1:"; cat "$1"; fail "expected a line matching /$2/"; }; }
expect_no_match() { ! grep -qE -- "$2" "$1" || { echo "---- $1:"; cat "$1"; fail "unexpected line matching /$2/"; }; }

SUFFIX="$(date +%s)-$$"
MULTI="interop-java-multi-$SUFFIX"
SINGLE="interop-java-single-$SUFFIX"
N_PLAIN=60
N_GZIP=40
N=$((N_PLAIN + N_GZIP))

step "kafka-topics --create"
kafka kafka-topics --bootstrap-server "$B" --create --topic "$MULTI" --partitions 3 --replication-factor 1 >"$WORK/create1"
expect_line "$WORK/create1" "Created topic $MULTI."
kafka kafka-topics --bootstrap-server "$B" --create --topic "$SINGLE" --partitions 1 --replication-factor 1 \
    --config retention.ms=86400000 >"$WORK/create2"
expect_line "$WORK/create2" "Created topic $SINGLE."

step "kafka-topics --list"
kafka kafka-topics --bootstrap-server "$B" --list >"$WORK/list"
expect_line "$WORK/list" "$MULTI"
expect_line "$WORK/list" "$SINGLE"

step "kafka-topics --describe"
kafka kafka-topics --bootstrap-server "$B" --describe --topic "$MULTI" >"$WORK/describe"
cat "$WORK/describe"
expect_match "$WORK/describe" "^Topic: $MULTI\s.*PartitionCount: 3\s.*ReplicationFactor: 1"
for p in 0 1 2; do
    expect_match "$WORK/describe" "^\s*Topic: $MULTI\s+Partition: $p\s+Leader: [0-9]+\s+Replicas: [0-9]+\s+Isr: [0-9]+"
done
kafka kafka-topics --bootstrap-server "$B" --describe --topic "$SINGLE" >"$WORK/describe2"
expect_match "$WORK/describe2" "Configs:.*retention.ms=86400000"

step "kafka-console-producer: $N_PLAIN records, then $N_GZIP gzip-compressed, with keys and headers"
# Lines are: headers TAB key TAB value.
line() { printf 'seq:%d,origin:java\tkey-%d\tvalue-%d\n' "$1" "$1" "$1"; }
for ((i = 0; i < N_PLAIN; i++)); do line "$i"; done >"$WORK/input1"
for ((i = N_PLAIN; i < N; i++)); do line "$i"; done >"$WORK/input2"
producer_props=(--reader-property parse.key=true --reader-property parse.headers=true
    --reader-property "key.separator=$(printf '\t')")
kafka kafka-console-producer --bootstrap-server "$B" --topic "$SINGLE" "${producer_props[@]}" <"$WORK/input1"
kafka kafka-console-producer --bootstrap-server "$B" --topic "$SINGLE" "${producer_props[@]}" \
    --compression-codec gzip <"$WORK/input2"

step "kafka-console-consumer --partition 0 --offset earliest --max-messages $N"
kafka kafka-console-consumer --bootstrap-server "$B" --topic "$SINGLE" --partition 0 --offset earliest \
    --max-messages "$N" --timeout-ms 30000 \
    --formatter-property print.key=true --formatter-property print.headers=true \
    --formatter-property print.offset=true --formatter-property print.partition=true \
    >"$WORK/consumed" 2>"$WORK/consumer.err" || { cat "$WORK/consumer.err"; fail "console consumer failed"; }
for ((i = 0; i < N; i++)); do
    printf 'Partition:0\tOffset:%d\tseq:%d,origin:java\tkey-%d\tvalue-%d\n' "$i" "$i" "$i" "$i"
done >"$WORK/expected"
if ! diff -u "$WORK/expected" "$WORK/consumed" >"$WORK/diff"; then
    head -40 "$WORK/diff"
    fail "console consumer output differs from what was produced"
fi
expect_match "$WORK/consumer.err" "Processed a total of $N messages"
echo "consumed $N records in order with keys and headers"

step "kafka-get-offsets"
kafka kafka-get-offsets --bootstrap-server "$B" --topic "$SINGLE" >"$WORK/latest"
expect_line "$WORK/latest" "$SINGLE:0:$N"
kafka kafka-get-offsets --bootstrap-server "$B" --topic "$SINGLE" --time -2 >"$WORK/earliest"
expect_line "$WORK/earliest" "$SINGLE:0:0"
kafka kafka-get-offsets --bootstrap-server "$B" --topic "$MULTI" >"$WORK/multi"
for p in 0 1 2; do expect_line "$WORK/multi" "$MULTI:$p:0"; done
cat "$WORK/latest" "$WORK/earliest" "$WORK/multi"

step "kafka-dump-log --files on the broker's segment"
SEGMENT="$GREGOR_LOG_DIR/$SINGLE-0/00000000000000000000.log"
[[ -f "$SEGMENT" ]] || { ls -la "$GREGOR_LOG_DIR" "$GREGOR_LOG_DIR/$SINGLE-0" || true; fail "no segment file $SEGMENT"; }
kafka kafka-dump-log --files "$SEGMENT" --print-data-log >"$WORK/dump" 2>&1 || { cat "$WORK/dump"; fail "kafka-dump-log failed"; }
head -5 "$WORK/dump"
expect_line "$WORK/dump" "Log starting offset: 0"
expect_no_match "$WORK/dump" "isvalid: false|Exception|Found [0-9]+ invalid bytes"
expect_match "$WORK/dump" "^baseOffset: 0 lastOffset: [0-9]+ count: [0-9]+ .*magic: 2 compresscodec: none .*isvalid: true"
expect_match "$WORK/dump" "^baseOffset: [0-9]+ lastOffset: $((N - 1)) count: [0-9]+ .*magic: 2 compresscodec: gzip .*isvalid: true"
records=$(grep -c '^| offset: ' "$WORK/dump" || true)
[[ "$records" == "$N" ]] || fail "kafka-dump-log shows $records records, expected $N"
for i in 0 $((N_PLAIN - 1)) $N_PLAIN $((N - 1)); do
    expect_match "$WORK/dump" "^\| offset: $i .*headerKeys: \[seq,origin\] key: key-$i payload: value-$i"'$' 
done
echo "segment holds $N valid records (plain and gzip batches)"

step "kafka-topics --delete"
kafka kafka-topics --bootstrap-server "$B" --delete --topic "$MULTI"
# Deletion completes asynchronously: poll the listing, boundedly.
for attempt in $(seq 1 15); do
    kafka kafka-topics --bootstrap-server "$B" --list >"$WORK/list2"
    grep -qxF "$MULTI" "$WORK/list2" || break
    [[ $attempt == 15 ]] && fail "$MULTI still listed after deletion"
done
expect_line "$WORK/list2" "$SINGLE"

printf '\ninterop-java: all checks passed against %s\n' "$B"
