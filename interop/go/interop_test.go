// Package interop drives the broker at $GREGOR_BOOTSTRAP with franz-go (github.com/twmb/franz-go),
// a Kafka client we did not write: produce and consume in a consumer group with commits,
// transactions (commits and aborts interleaved, read_committed and read_uncommitted consumers,
// kadm's ListTransactions and DescribeTransactions) and, against the secured broker that
// `cargo xtask test` starts beside it (GREGOR_SASL_SSL_BOOTSTRAP and the others, see
// interop/README.md), SCRAM over TLS, SCRAM-SHA-256 and PLAIN, TLS and mTLS, and the ways a
// login must fail: a wrong password, an untrusted certificate, no client certificate.
//
// Run by `cargo xtask test --only go` (or `--against-kafka` to check the tests themselves).
package interop

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// timeout bounds every test's work; a hung broker fails the test instead of holding CI.
const timeout = 90 * time.Second

func bootstrap(t *testing.T) string {
	t.Helper()
	b := os.Getenv("GREGOR_BOOTSTRAP")
	if b == "" {
		t.Fatal("GREGOR_BOOTSTRAP must be host:port of the broker under test (cargo xtask test sets it)")
	}
	return b
}

// replicationFactor is GREGOR_REPLICATION_FACTOR, 1 unless set.
func replicationFactor(t *testing.T) int16 {
	t.Helper()
	rf := os.Getenv("GREGOR_REPLICATION_FACTOR")
	if rf == "" {
		return 1
	}
	n, err := strconv.Atoi(rf)
	if err != nil {
		t.Fatalf("GREGOR_REPLICATION_FACTOR=%q: %v", rf, err)
	}
	return int16(n)
}

// secureEnv returns the secured broker's variable name, skipping the test when the run has no
// secured broker (the 3-node cluster run); `cargo xtask test`'s one-node runs always set them.
func secureEnv(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Skipf("%s is not set: no secured broker in this run", name)
	}
	return v
}

func unique(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano(), os.Getpid())
}

func newClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func createTopic(ctx context.Context, t *testing.T, adm *kadm.Client, topic string, partitions int32) {
	t.Helper()
	resp, err := adm.CreateTopic(ctx, partitions, replicationFactor(t), nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating %s: %v", topic, err)
	}
}

// produce sends records synchronously and fails the test on any error.
func produce(ctx context.Context, t *testing.T, cl *kgo.Client, rs ...*kgo.Record) {
	t.Helper()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
}

// consumeKeys reads topic from the start with cl's options until want records have come, and
// returns their keys sorted.
func consumeKeys(ctx context.Context, t *testing.T, want int, opts ...kgo.Opt) []string {
	t.Helper()
	cl := newClient(t, opts...)
	var keys []string
	for len(keys) < want {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records before the deadline: %v", len(keys), want, err)
		}
		fs.EachError(func(topic string, p int32, err error) {
			t.Fatalf("fetching %s[%d]: %v", topic, p, err)
		})
		fs.EachRecord(func(r *kgo.Record) { keys = append(keys, string(r.Key)) })
	}
	sort.Strings(keys)
	return keys
}

func sameKeys(t *testing.T, what string, got, want []string) {
	t.Helper()
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("%s: got %d records %v, want %d %v", what, len(got), got, len(want), want)
	}
}

// TestGroupConsumer: keyed records over 3 partitions; one group member reads them all and
// commits; the committed offsets are the end offsets; then two members share the partitions
// and read only the records produced after the commit.
func TestGroupConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	b := bootstrap(t)
	topic, group := unique("interop-go-group"), unique("interop-go-g")
	admin := kadm.NewClient(newClient(t, kgo.SeedBrokers(b)))
	createTopic(ctx, t, admin, topic, 3)

	producer := newClient(t, kgo.SeedBrokers(b), kgo.DefaultProduceTopic(topic))
	var first []string
	var rs []*kgo.Record
	for i := 0; i < 60; i++ {
		k := fmt.Sprintf("k-%02d", i)
		first = append(first, k)
		rs = append(rs, &kgo.Record{Key: []byte(k), Value: []byte("v-" + k)})
	}
	produce(ctx, t, producer, rs...)

	member := func() []kgo.Opt {
		return []kgo.Opt{
			kgo.SeedBrokers(b), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(),
		}
	}
	one := newClient(t, member()...)
	var got []string
	for len(got) < len(first) {
		fs := one.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("the group member read %d of %d records", len(got), len(first))
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetching %s[%d]: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Key)) })
	}
	sort.Strings(got)
	sameKeys(t, "the lone member", got, first)
	if err := one.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("committing: %v", err)
	}
	one.Close() // leaves the group

	ends, err := admin.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("ListEndOffsets: %v", err)
	}
	committed, err := admin.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("FetchOffsets: %v", err)
	}
	var total int64
	for p := int32(0); p < 3; p++ {
		end, ok := ends.Lookup(topic, p)
		c, ok2 := committed.Lookup(topic, p)
		if !ok || !ok2 || end.Err != nil || c.Err != nil || c.At != end.Offset {
			t.Fatalf("partition %d: committed %+v, end %+v", p, c, end)
		}
		total += end.Offset
	}
	if total != 60 {
		t.Fatalf("the end offsets add up to %d, want 60", total)
	}
	described, err := admin.DescribeGroups(ctx, group)
	if err != nil || described[group].Err != nil || described[group].State != "Empty" {
		t.Fatalf("the group after its member left: %+v, %v", described[group], err)
	}

	var second []string
	rs = nil
	for i := 0; i < 30; i++ {
		k := fmt.Sprintf("n-%02d", i)
		second = append(second, k)
		rs = append(rs, &kgo.Record{Key: []byte(k), Value: []byte("v-" + k)})
	}
	produce(ctx, t, producer, rs...)

	// Two members: together they read exactly the new records (a partition handed over in a
	// rebalance may give a record twice; never an old one, never one missed).
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	members := []*kgo.Client{newClient(t, member()...), newClient(t, member()...)}
	done := make(chan struct{})
	for _, m := range members {
		wg.Add(1)
		go func(m *kgo.Client) {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				pctx, pcancel := context.WithTimeout(ctx, time.Second)
				fs := m.PollFetches(pctx)
				pcancel()
				mu.Lock()
				fs.EachRecord(func(r *kgo.Record) { seen[string(r.Key)] = true })
				mu.Unlock()
				if ctx.Err() != nil {
					return
				}
			}
		}(m)
	}
	// Both members are in, with the 3 partitions split between them.
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		d, err := admin.DescribeGroups(ctx, group)
		if err == nil && d[group].Err == nil && n >= len(second) && d[group].State == "Stable" && len(d[group].Members) == 2 {
			parts := map[int32]bool{}
			for _, m := range d[group].Members {
				a, ok := m.Assigned.AsConsumer()
				if !ok {
					t.Fatalf("member %s has no consumer assignment", m.MemberID)
				}
				for _, at := range a.Topics {
					for _, p := range at.Partitions {
						if parts[p] {
							t.Fatalf("partition %d assigned twice: %+v", p, d[group].Members)
						}
						parts[p] = true
					}
				}
			}
			if len(parts) == 3 {
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("two members did not share the partitions and read the new records: %d read, group %+v", n, d[group])
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(done)
	wg.Wait()
	var keys []string
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	sameKeys(t, "two members after the commit", keys, second)
}

// TestTransactions: six transactions of one transactional producer, commits and aborts in
// turn, records over 2 partitions; kadm describes the open one and lists the finished ones;
// a read_committed consumer sees exactly the committed records, a read_uncommitted one all.
func TestTransactions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	b := bootstrap(t)
	topic, txnID := unique("interop-go-txn"), unique("interop-go-txn-id")
	admin := kadm.NewClient(newClient(t, kgo.SeedBrokers(b)))
	createTopic(ctx, t, admin, topic, 2)

	producer := newClient(t, kgo.SeedBrokers(b), kgo.DefaultProduceTopic(topic),
		kgo.TransactionalID(txnID), kgo.TransactionTimeout(60*time.Second),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var committed, all []string
	for txn := 0; txn < 6; txn++ {
		if err := producer.BeginTransaction(); err != nil {
			t.Fatalf("BeginTransaction %d: %v", txn, err)
		}
		var rs []*kgo.Record
		for i := 0; i < 5; i++ {
			k := fmt.Sprintf("t%d-%d", txn, i)
			rs = append(rs, &kgo.Record{Key: []byte(k), Value: []byte(k), Partition: int32(i % 2)})
			all = append(all, k)
			if txn%2 == 0 {
				committed = append(committed, k)
			}
		}
		produce(ctx, t, producer, rs...)
		if txn == 3 {
			// Open, with both partitions in it.
			d, err := admin.DescribeTransactions(ctx, txnID)
			if err != nil || d[txnID].Err != nil {
				t.Fatalf("DescribeTransactions: %v %+v", err, d)
			}
			dt := d[txnID]
			if dt.State != "Ongoing" || len(dt.Topics[topic]) != 2 || dt.ProducerID < 0 || dt.TimeoutMillis != 60000 {
				t.Fatalf("the open transaction described as %+v", dt)
			}
			listed, err := admin.ListTransactions(ctx, nil, []string{"Ongoing"})
			if err != nil {
				t.Fatalf("ListTransactions: %v", err)
			}
			if l, ok := listed[txnID]; !ok || l.State != "Ongoing" || l.ProducerID != dt.ProducerID {
				t.Fatalf("ListTransactions(Ongoing) gave %+v for %s", listed[txnID], txnID)
			}
		}
		commit := kgo.TryAbort
		if txn%2 == 0 {
			commit = kgo.TryCommit
		}
		if err := producer.EndTransaction(ctx, commit); err != nil {
			t.Fatalf("EndTransaction %d (commit %v): %v", txn, commit, err)
		}
	}
	d, err := admin.DescribeTransactions(ctx, txnID)
	if err != nil || d[txnID].Err != nil {
		t.Fatalf("DescribeTransactions: %v %+v", err, d)
	}
	// The markers may still be on their way (PrepareAbort) right after EndTransaction returns.
	if s := d[txnID].State; s != "CompleteAbort" && s != "PrepareAbort" {
		t.Fatalf("after the last (aborted) transaction: state %s", s)
	}
	listed, err := admin.ListTransactions(ctx, nil, nil)
	if err != nil {
		t.Fatalf("ListTransactions: %v", err)
	}
	if l, ok := listed[txnID]; !ok || l.ProducerID != d[txnID].ProducerID {
		t.Fatalf("ListTransactions has no %s: %+v", txnID, listed)
	}

	// A record after the transactions on each partition, from a plain producer: once a
	// read_committed consumer sees it, everything before it is decided.
	plainProducer := newClient(t, kgo.SeedBrokers(b), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produce(ctx, t, plainProducer,
		&kgo.Record{Key: []byte("end-0"), Partition: 0}, &kgo.Record{Key: []byte("end-1"), Partition: 1})
	committed = append(committed, "end-0", "end-1")
	all = append(all, "end-0", "end-1")

	read := func(level kgo.IsolationLevel, want int) []string {
		return consumeKeys(ctx, t, want, kgo.SeedBrokers(b), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(level))
	}
	sameKeys(t, "read_committed", read(kgo.ReadCommitted(), len(committed)), committed)
	sameKeys(t, "read_uncommitted", read(kgo.ReadUncommitted(), len(all)), all)

	// The end offsets count every record and one marker per transaction and partition.
	ends, err := admin.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("ListEndOffsets: %v", err)
	}
	for p := int32(0); p < 2; p++ {
		o, _ := ends.Lookup(topic, p)
		// 6 transactions: 3 or 2 records each (i%2 == p) and a marker, then the end record.
		want := int64(0)
		for i := 0; i < 5; i++ {
			if int32(i%2) == p {
				want++
			}
		}
		want = 6*(want+1) + 1
		if o.Err != nil || o.Offset != want {
			t.Fatalf("partition %d ends at %+v, want %d", p, o, want)
		}
	}
}

// TestGroupTransactSession: consume-transform-produce with franz-go's GroupTransactSession: each
// input record copied to the output topic in transactions that also commit the group's offsets;
// an aborted round is read again and the output has each input exactly once.
func TestGroupTransactSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	b := bootstrap(t)
	in, out := unique("interop-go-eos-in"), unique("interop-go-eos-out")
	group, txnID := unique("interop-go-eos-g"), unique("interop-go-eos-id")
	admin := kadm.NewClient(newClient(t, kgo.SeedBrokers(b)))
	createTopic(ctx, t, admin, in, 2)
	createTopic(ctx, t, admin, out, 1)
	var want []string
	var rs []*kgo.Record
	for i := 0; i < 20; i++ {
		k := fmt.Sprintf("in-%02d", i)
		want = append(want, k)
		rs = append(rs, &kgo.Record{Topic: in, Key: []byte(k)})
	}
	produce(ctx, t, newClient(t, kgo.SeedBrokers(b)), rs...)

	sess, err := kgo.NewGroupTransactSession(kgo.SeedBrokers(b), kgo.TransactionalID(txnID),
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(in), kgo.DefaultProduceTopic(out),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.TransactionTimeout(60*time.Second))
	if err != nil {
		t.Fatalf("NewGroupTransactSession: %v", err)
	}
	defer sess.Close()
	copied, aborted := 0, false
	for copied < len(want) {
		fs := sess.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("copied %d of %d records before the deadline", copied, len(want))
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetching %s[%d]: %v", topic, p, err) })
		if fs.NumRecords() == 0 {
			continue
		}
		if err := sess.Begin(); err != nil {
			t.Fatalf("Begin: %v", err)
		}
		n := 0
		var mu sync.Mutex
		var failed []error
		fs.EachRecord(func(r *kgo.Record) {
			sess.Produce(ctx, &kgo.Record{Key: r.Key, Value: []byte("copied")}, func(_ *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					failed = append(failed, fmt.Errorf("the copy of %s: %w", r.Key, err))
					mu.Unlock()
				}
			})
			n++
		})
		// The first round is aborted: its input must be read again, its output never seen
		// (its buffered copies fail with "aborting buffered records").
		end := kgo.TryCommit
		if !aborted {
			end, aborted = kgo.TryAbort, true
		}
		ok, err := sess.End(ctx, end)
		if err != nil {
			t.Fatalf("End: %v", err)
		}
		if ok && end == kgo.TryCommit {
			mu.Lock()
			if len(failed) > 0 {
				t.Fatalf("a committed round lost records: %v", failed)
			}
			mu.Unlock()
			copied += n
		}
	}
	got := consumeKeys(ctx, t, len(want), kgo.SeedBrokers(b), kgo.ConsumeTopics(out),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	sameKeys(t, "the copies", got, want)
	committed, err := admin.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("FetchOffsets: %v", err)
	}
	ends, err := admin.ListEndOffsets(ctx, in)
	if err != nil {
		t.Fatalf("ListEndOffsets: %v", err)
	}
	for p := int32(0); p < 2; p++ {
		c, _ := committed.Lookup(in, p)
		e, _ := ends.Lookup(in, p)
		if c.Err != nil || e.Err != nil || c.At != e.Offset {
			t.Fatalf("partition %d: committed %+v, end %+v", p, c, e)
		}
	}
}

func caPool(t *testing.T, file string) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("reading %s: %v", file, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", file)
	}
	return pool
}

// roundTrip creates a topic through the client's options, produces 10 records and reads
// them back: the whole client path (metadata, admin, produce, fetch) over that listener.
func roundTrip(t *testing.T, opts ...kgo.Opt) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	topic := unique("interop-go-sec")
	cl := newClient(t, opts...)
	createTopic(ctx, t, kadm.NewClient(cl), topic, 1)
	var want []string
	var rs []*kgo.Record
	for i := 0; i < 10; i++ {
		k := fmt.Sprintf("s-%d", i)
		want = append(want, k)
		rs = append(rs, &kgo.Record{Topic: topic, Key: []byte(k)})
	}
	produce(ctx, t, cl, rs...)
	got := consumeKeys(ctx, t, len(want),
		append(opts, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	sameKeys(t, "over the secured listener", got, want)
}

// loginFails checks that a client with opts cannot even ask for metadata, and returns the
// error for the caller to classify.
func loginFails(t *testing.T, opts ...kgo.Opt) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := newClient(t, append(opts, kgo.RequestRetries(0))...)
	err := cl.Ping(ctx)
	if err == nil {
		t.Fatal("the client was let in")
	}
	if ctx.Err() != nil {
		t.Fatalf("the client hung instead of failing: %v", err)
	}
	return err
}

func scramOverTLS(t *testing.T, password string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(secureEnv(t, "GREGOR_SASL_SSL_BOOTSTRAP")),
		kgo.DialTLSConfig(&tls.Config{RootCAs: caPool(t, secureEnv(t, "GREGOR_CA"))}),
		kgo.SASL(scram.Auth{User: secureEnv(t, "GREGOR_SCRAM512_USER"), Pass: password}.AsSha512Mechanism()),
	}
}

// TestSCRAMOverTLS: SASL_SSL with SCRAM-SHA-512 works end to end; a wrong password gets
// SASL_AUTHENTICATION_FAILED; a client that does not trust the broker's CA stops at TLS.
func TestSCRAMOverTLS(t *testing.T) {
	roundTrip(t, scramOverTLS(t, secureEnv(t, "GREGOR_SCRAM512_PASSWORD"))...)

	t.Run("wrong password", func(t *testing.T) {
		err := loginFails(t, scramOverTLS(t, "not-the-password")...)
		if !errors.Is(err, kerr.SaslAuthenticationFailed) {
			t.Fatalf("want SASL_AUTHENTICATION_FAILED, got %v", err)
		}
	})
	t.Run("untrusted CA", func(t *testing.T) {
		opts := scramOverTLS(t, secureEnv(t, "GREGOR_SCRAM512_PASSWORD"))
		opts[1] = kgo.DialTLSConfig(&tls.Config{RootCAs: caPool(t, secureEnv(t, "GREGOR_UNTRUSTED_CA"))})
		err := loginFails(t, opts...)
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &unknown) {
			t.Fatalf("want x509.UnknownAuthorityError, got %v", err)
		}
	})
}

// TestSASLPlaintext: SCRAM-SHA-256 and PLAIN on the SASL_PLAINTEXT listener; a wrong PLAIN
// password fails.
func TestSASLPlaintext(t *testing.T) {
	b := secureEnv(t, "GREGOR_SASL_PLAINTEXT_BOOTSTRAP")
	scram256 := scram.Auth{User: secureEnv(t, "GREGOR_SCRAM256_USER"), Pass: secureEnv(t, "GREGOR_SCRAM256_PASSWORD")}
	roundTrip(t, kgo.SeedBrokers(b), kgo.SASL(scram256.AsSha256Mechanism()))
	plainAuth := func(pass string) sasl.Mechanism {
		return plain.Auth{User: secureEnv(t, "GREGOR_PLAIN_USER"), Pass: pass}.AsMechanism()
	}
	roundTrip(t, kgo.SeedBrokers(b), kgo.SASL(plainAuth(secureEnv(t, "GREGOR_PLAIN_PASSWORD"))))
	err := loginFails(t, kgo.SeedBrokers(b), kgo.SASL(plainAuth("wrong")))
	if !errors.Is(err, kerr.SaslAuthenticationFailed) {
		t.Fatalf("want SASL_AUTHENTICATION_FAILED, got %v", err)
	}
}

// TestTLS: the SSL listener (client certificates requested) with and without a client
// certificate, the MTLS listener (required) with one; without one, or with one from another
// CA, the MTLS listener lets no request through.
func TestTLS(t *testing.T) {
	pool := caPool(t, secureEnv(t, "GREGOR_CA"))
	cert, err := tls.LoadX509KeyPair(secureEnv(t, "GREGOR_CLIENT_CERT"), secureEnv(t, "GREGOR_CLIENT_KEY"))
	if err != nil {
		t.Fatalf("loading the client certificate: %v", err)
	}
	stranger, err := tls.LoadX509KeyPair(secureEnv(t, "GREGOR_UNTRUSTED_CLIENT_CERT"), secureEnv(t, "GREGOR_UNTRUSTED_CLIENT_KEY"))
	if err != nil {
		t.Fatalf("loading the untrusted client certificate: %v", err)
	}
	ssl, mtls := secureEnv(t, "GREGOR_SSL_BOOTSTRAP"), secureEnv(t, "GREGOR_MTLS_BOOTSTRAP")
	roundTrip(t, kgo.SeedBrokers(ssl), kgo.DialTLSConfig(&tls.Config{RootCAs: pool}))
	roundTrip(t, kgo.SeedBrokers(mtls), kgo.DialTLSConfig(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}))
	// In TLS 1.3 the server checks the client's certificate after the client's handshake is
	// done: the refusal comes as an alert on the first read.
	for name, certs := range map[string][]tls.Certificate{"no certificate": nil, "untrusted certificate": {stranger}} {
		t.Run(name, func(t *testing.T) {
			err := loginFails(t, kgo.SeedBrokers(mtls), kgo.DialTLSConfig(&tls.Config{RootCAs: pool, Certificates: certs}))
			if !strings.Contains(err.Error(), "tls:") && !strings.Contains(err.Error(), "EOF") &&
				!strings.Contains(err.Error(), "connection reset") {
				t.Fatalf("want a TLS refusal, got %v", err)
			}
		})
	}
}
