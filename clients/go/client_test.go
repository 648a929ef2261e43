package chorus_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	chorus "github.com/chorus-log/chorus/clients/go"
	"github.com/chorus-log/chorus/clients/go/chorusv1"
)

const group = 1

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, endpoints []string, opts ...chorus.Option) *chorus.Client {
	t.Helper()
	c, err := chorus.Dial(endpoints, opts...)
	if err != nil {
		t.Fatalf("Dial(%v): %v", endpoints, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func payloads(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "%s-%d", prefix, i)
	}
	return out
}

// mustCommit appends and fails the test unless every record committed, with
// increasing LSNs and CSNs.
func mustCommit(t *testing.T, c *chorus.Client, recs [][]byte) []chorus.Outcome {
	t.Helper()
	out, err := c.Append(ctxFor(t, 30*time.Second), group, recs)
	if err != nil {
		t.Fatalf("Append: %v (outcomes %+v)", err, out)
	}
	if len(out) != len(recs) {
		t.Fatalf("%d outcomes for %d records", len(out), len(recs))
	}
	for i, o := range out {
		if o.State != chorus.Committed || !o.Appended || o.Err != nil || o.LSN == 0 || o.CSN == 0 {
			t.Fatalf("record %d: %+v, want committed with LSN and CSN", i, o)
		}
		if i > 0 && (o.LSN <= out[i-1].LSN || o.CSN <= out[i-1].CSN) {
			t.Fatalf("record %d: LSN/CSN %d/%d not after %d/%d", i, o.LSN, o.CSN, out[i-1].LSN, out[i-1].CSN)
		}
	}
	return out
}

// readAll reads the whole log, from 0 to its committed end (waiting, up to a deadline,
// until the node that answers has committed at least through atLeast).
func readAll(t *testing.T, c *chorus.Client, atLeast uint64) []chorus.Record {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	for {
		var recs []chorus.Record
		from := uint64(0)
		var end uint64
		for {
			r, err := c.Read(ctx, group, from, 0)
			if err != nil {
				t.Fatalf("Read(%d): %v", from, err)
			}
			recs = append(recs, r.Records...)
			end = r.CommittedEnd
			if len(r.Records) == 0 || r.NextLSN >= r.CommittedEnd {
				from = r.NextLSN
				break
			}
			from = r.NextLSN
		}
		if from > atLeast {
			return recs
		}
		if ctx.Err() != nil {
			t.Fatalf("the log's committed end stayed at %d (read to %d), want past %d", end, from, atLeast)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func checkInLog(t *testing.T, log []chorus.Record, recs [][]byte, out []chorus.Outcome) {
	t.Helper()
	at := map[uint64]chorus.Record{}
	for _, r := range log {
		at[r.LSN] = r
	}
	for i, o := range out {
		r, ok := at[o.LSN]
		if !ok {
			t.Fatalf("record %d committed at LSN %d is not in the log", i, o.LSN)
		}
		if !bytes.Equal(r.Data, recs[i]) || r.CSN != o.CSN {
			t.Fatalf("LSN %d holds %q (CSN %d), want %q (CSN %d)", o.LSN, r.Data, r.CSN, recs[i], o.CSN)
		}
	}
}

// TestCluster runs the client against a plain 3-node cluster.
func TestCluster(t *testing.T) {
	cl := startCluster(t)

	t.Run("AppendOutcomesAndReadBack", func(t *testing.T) {
		c := dial(t, cl.endpoints)
		recs := payloads("first", 5)
		out := mustCommit(t, c, recs)
		// A record read back at its LSN, and the whole log.
		r, err := c.Read(ctxFor(t, 10*time.Second), group, out[2].LSN, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Records) != 2 || r.Records[0].LSN != out[2].LSN || !bytes.Equal(r.Records[0].Data, recs[2]) ||
			r.Records[1].LSN != out[3].LSN || r.NextLSN <= out[3].LSN || r.CommittedEnd <= out[4].LSN {
			t.Fatalf("Read from LSN %d: %+v", out[2].LSN, r)
		}
		checkInLog(t, readAll(t, c, out[4].LSN), recs, out)
		// Locate by CSN.
		lsn, found, err := c.Locate(ctxFor(t, 10*time.Second), group, out[3].CSN)
		if err != nil || !found || lsn != out[3].LSN {
			t.Fatalf("Locate(CSN %d) = %d, %v, %v; want %d", out[3].CSN, lsn, found, err, out[3].LSN)
		}
		if _, found, err = c.Locate(ctxFor(t, 10*time.Second), group, 1<<60); err != nil || found {
			t.Fatalf("Locate(a CSN past the end) = %v, %v", found, err)
		}
		// ref_csn lifts the CSN.
		o, err := c.Append(ctxFor(t, 10*time.Second), group, [][]byte{[]byte("lifted")}, chorus.WithRefCSN(out[4].CSN+1000))
		if err != nil || o[0].CSN < out[4].CSN+1000 {
			t.Fatalf("Append with ref CSN: %+v, %v", o, err)
		}
	})

	t.Run("LeaderFoundFromFollowerFirst", func(t *testing.T) {
		probe := dial(t, cl.endpoints)
		leader, leaderEP, err := probe.Leader(ctxFor(t, 10*time.Second), group)
		if err != nil {
			t.Fatal(err)
		}
		// The followers first, the leader last.
		var eps []string
		for _, ep := range cl.endpoints {
			if ep != leaderEP {
				eps = append(eps, ep)
			}
		}
		eps = append(eps, leaderEP)
		c := dial(t, eps)
		// What the client relies on: a follower refuses an append FAILED_PRECONDITION,
		// naming the leader's node id in the chorus-leader trailer.
		var md metadata.MD
		_, err = c.Stub(0).Append(ctxFor(t, 10*time.Second), &chorusv1.AppendRequest{Group: group, Records: [][]byte{[]byte("x")}}, grpc.Trailer(&md))
		if status.Code(err) != codes.FailedPrecondition || len(md.Get(chorus.LeaderKey)) != 1 || md.Get(chorus.LeaderKey)[0] != fmt.Sprint(leader) {
			t.Fatalf("append at a follower: %v, trailer %v; want FAILED_PRECONDITION naming node %d", err, md, leader)
		}
		if _, ok := c.KnownLeader(group); ok {
			t.Fatal("a new client knows a leader")
		}
		recs := payloads("via-follower", 3)
		out := mustCommit(t, c, recs)
		if ep, ok := c.KnownLeader(group); !ok || ep != leaderEP {
			t.Fatalf("KnownLeader = %q, %v; want node %d at %s", ep, ok, leader, leaderEP)
		}
		checkInLog(t, readAll(t, c, out[2].LSN), recs, out)

		// Knowing the node ids (Status), a follower's hint leads straight there.
		c2 := dial(t, eps)
		for _, ns := range c2.Status(ctxFor(t, 10*time.Second), group) {
			if ns.Err != nil {
				t.Fatalf("Status %s: %v", ns.Endpoint, ns.Err)
			}
			if len(ns.Groups) != 1 || ns.Groups[0].Group != group || ns.Groups[0].Mode != "ordered" {
				t.Fatalf("Status %s: %+v", ns.Endpoint, ns.Groups)
			}
		}
		mustCommit(t, c2, payloads("via-hint", 1))
		if ep, _ := c2.KnownLeader(group); ep != leaderEP {
			t.Fatalf("KnownLeader = %q; want %s", ep, leaderEP)
		}
	})

	t.Run("UnreachableEndpointIsSkipped", func(t *testing.T) {
		// Nothing listens on the first endpoint: a connection that could not be made
		// did nothing, so the append goes on to the others.
		dead := fmt.Sprintf("127.0.0.1:%d", freeBase(t, 1)+1)
		c := dial(t, append([]string{dead}, cl.endpoints...))
		mustCommit(t, c, payloads("after-dead", 2))
		// Every endpoint dead: no leader, nothing appended.
		c2 := dial(t, []string{dead}, chorus.WithLeaderTimeout(500*time.Millisecond))
		out, err := c2.Append(ctxFor(t, 10*time.Second), group, payloads("nowhere", 2))
		if !errors.Is(err, chorus.ErrNoLeader) {
			t.Fatalf("Append to a dead endpoint: %v, want ErrNoLeader", err)
		}
		for _, o := range out {
			if o.State != chorus.Failed || o.Appended || !errors.Is(o.Err, chorus.ErrNoLeader) {
				t.Fatalf("outcome %+v, want failed (no leader)", o)
			}
		}
		var nl *chorus.NoLeaderError
		if !errors.As(err, &nl) || nl.Group != group || !strings.Contains(nl.Last, "refused") {
			t.Fatalf("errors.As NoLeaderError: %#v", nl)
		}
		// Reads: unavailable; a tail gives up after the leader timeout.
		if _, err := c2.Read(ctxFor(t, 10*time.Second), group, 0, 0); !errors.Is(err, chorus.ErrUnavailable) {
			t.Fatalf("Read from a dead endpoint: %v", err)
		}
		started := time.Now()
		for _, err := range c2.Tail(ctxFor(t, 10*time.Second), group, 0) {
			if !errors.Is(err, chorus.ErrUnavailable) || time.Since(started) > 5*time.Second {
				t.Fatalf("Tail from a dead endpoint: %v after %v", err, time.Since(started))
			}
			break
		}
	})

	t.Run("Tail", func(t *testing.T) {
		c := dial(t, cl.endpoints)
		start := mustCommit(t, c, payloads("before-tail", 1))[0]
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		got := make(chan chorus.Record, 100)
		tailErr := make(chan error, 1)
		go func() {
			defer close(got)
			for rec, err := range c.Tail(ctx, group, start.LSN) {
				if err != nil {
					tailErr <- err
					return
				}
				got <- rec
			}
		}()
		// Records appended after the tail opened arrive too (the long poll).
		time.Sleep(300 * time.Millisecond)
		recs := payloads("tailed", 6)
		var outs []chorus.Outcome
		for i := 0; i < len(recs); i += 2 {
			outs = append(outs, mustCommit(t, c, recs[i:i+2])...)
		}
		want := append([][]byte{[]byte("before-tail-0")}, recs...)
		wantLSN := append([]uint64{start.LSN}, func() (l []uint64) {
			for _, o := range outs {
				l = append(l, o.LSN)
			}
			return
		}()...)
		for i := range want {
			select {
			case rec, ok := <-got:
				if !ok {
					t.Fatalf("the tail ended after %d records: %v", i, <-tailErr)
				}
				if rec.LSN != wantLSN[i] || !bytes.Equal(rec.Data, want[i]) {
					t.Fatalf("tail record %d: LSN %d %q, want LSN %d %q", i, rec.LSN, rec.Data, wantLSN[i], want[i])
				}
			case <-ctx.Done():
				t.Fatalf("the tail yielded %d of %d records", i, len(want))
			}
		}
		cancel()
		// Once ctx is done the iteration yields its error and ends.
		for range got {
		}
		if err := <-tailErr; !errors.Is(err, context.Canceled) {
			t.Fatalf("the tail ended with %v, want context.Canceled", err)
		}
		// Breaking out of the loop ends it too.
		n := 0
		for _, err := range c.Tail(ctxFor(t, 10*time.Second), group, 0) {
			if err != nil {
				t.Fatal(err)
			}
			if n++; n == 3 {
				break
			}
		}
	})

	t.Run("Errors", func(t *testing.T) {
		c := dial(t, cl.endpoints)
		// No such group: refused before anything was done.
		out, err := c.Append(ctxFor(t, 10*time.Second), 999, payloads("nogroup", 2))
		if !errors.Is(err, chorus.ErrNotFound) || status.Code(err) != codes.NotFound {
			t.Fatalf("Append to group 999: %v", err)
		}
		for _, o := range out {
			if o.State != chorus.Failed {
				t.Fatalf("outcome %+v, want failed", o)
			}
		}
		var se *chorus.StatusError
		if !errors.As(err, &se) || se.Endpoint == "" {
			t.Fatalf("errors.As StatusError: %v", err)
		}
		if _, err := c.Read(ctxFor(t, 10*time.Second), 999, 0, 0); !errors.Is(err, chorus.ErrNotFound) {
			t.Fatalf("Read of group 999: %v", err)
		}
		// An LSN past the committed end: OUT_OF_RANGE.
		if r, err := c.Read(ctxFor(t, 10*time.Second), group, 1<<50, 0); !errors.Is(err, chorus.ErrOutOfRange) {
			t.Fatalf("Read past the end: %+v, %v", r, err)
		}
		// Nothing to append: nothing sent.
		if out, err := c.Append(ctxFor(t, 10*time.Second), group, nil); out != nil || err != nil {
			t.Fatalf("empty Append: %v, %v", out, err)
		}
	})

	// Last: it stops the leader's process for a while.
	t.Run("NoAnswerIsIndeterminate", func(t *testing.T) {
		probe := dial(t, cl.endpoints)
		leader, leaderEP, err := probe.Leader(ctxFor(t, 10*time.Second), group)
		if err != nil {
			t.Fatal(err)
		}
		c := dial(t, []string{leaderEP}, chorus.WithCallTimeout(time.Second))
		mustCommit(t, c, payloads("before-stop", 1))
		pid := cl.pidOf(t, leader)
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer syscall.Kill(pid, syscall.SIGCONT)
		// The connection stays open but nothing answers: cut off by the call timeout,
		// the append may have been taken, and is not retried elsewhere.
		started := time.Now()
		out, err := c.Append(ctxFor(t, 30*time.Second), group, payloads("to-stopped", 2))
		if !errors.Is(err, chorus.ErrIndeterminate) {
			t.Fatalf("Append to a stopped leader: %v, want ErrIndeterminate", err)
		}
		if d := time.Since(started); d > 10*time.Second {
			t.Fatalf("took %v", d)
		}
		for _, o := range out {
			var ie *chorus.IndeterminateError
			if o.State != chorus.Unknown || !errors.As(o.Err, &ie) || !strings.Contains(ie.Detail, "no answer within 1s") {
				t.Fatalf("outcome %+v, want unknown (no answer within 1s)", o)
			}
		}
		// The caller's context ending mid-call is indeterminate too.
		short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if _, err := c.Append(short, group, payloads("to-stopped-ctx", 1)); !errors.Is(err, chorus.ErrIndeterminate) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Append with a short context: %v", err)
		}
	})
}

// TestSecuredCluster: `chorus dev --tls` (mutual TLS and the operator's token).
func TestSecuredCluster(t *testing.T) {
	cl := startCluster(t, "--tls")
	tlsDir := filepath.Join(cl.dir, "tls")
	for _, ep := range cl.endpoints {
		if !strings.HasPrefix(ep, "https://") {
			t.Fatalf("endpoint %s of a --tls cluster", ep)
		}
	}
	tok, err := os.ReadFile(filepath.Join(tlsDir, "operator.token"))
	if err != nil {
		t.Fatal(err)
	}
	secure := []chorus.Option{
		chorus.WithTLSCAFile(filepath.Join(tlsDir, "ca.pem")),
		chorus.WithTLSClientCertFiles(filepath.Join(tlsDir, "client.pem"), filepath.Join(tlsDir, "client.key")),
		chorus.WithTLSServerName("localhost"),
	}
	c := dial(t, cl.endpoints, append(secure, chorus.WithToken(string(tok)))...)
	recs := payloads("secure", 3)
	out := mustCommit(t, c, recs)
	checkInLog(t, readAll(t, c, out[2].LSN), recs, out)
	for _, ns := range c.Status(ctxFor(t, 10*time.Second), 0) {
		if ns.Err != nil {
			t.Fatalf("Status %s: %v", ns.Endpoint, ns.Err)
		}
	}
	for rec, err := range c.Tail(ctxFor(t, 10*time.Second), group, out[1].LSN) {
		if err != nil || rec.LSN != out[1].LSN || !bytes.Equal(rec.Data, recs[1]) {
			t.Fatalf("Tail: %+v, %v", rec, err)
		}
		break
	}
	// Host:port endpoints are dialled with TLS too.
	var bare []string
	for _, ep := range cl.endpoints {
		bare = append(bare, strings.TrimPrefix(ep, "https://"))
	}
	mustCommit(t, dial(t, bare, append(secure, chorus.WithToken(string(tok)))...), payloads("bare", 1))

	// No token, or one the nodes do not know: UNAUTHENTICATED, nothing appended.
	for name, opts := range map[string][]chorus.Option{
		"no token":  secure,
		"bad token": append(secure, chorus.WithToken("not-the-operator-token-0123")),
	} {
		c := dial(t, cl.endpoints, opts...)
		out, err := c.Append(ctxFor(t, 10*time.Second), group, payloads("unauthenticated", 2))
		if !errors.Is(err, chorus.ErrUnauthenticated) || status.Code(err) != codes.Unauthenticated {
			t.Fatalf("%s: Append: %v, want ErrUnauthenticated", name, err)
		}
		for _, o := range out {
			if o.State != chorus.Failed || !errors.Is(o.Err, chorus.ErrUnauthenticated) {
				t.Fatalf("%s: outcome %+v, want failed (unauthenticated)", name, o)
			}
		}
		if _, err := c.Read(ctxFor(t, 10*time.Second), group, 0, 0); !errors.Is(err, chorus.ErrUnauthenticated) {
			t.Fatalf("%s: Read: %v, want ErrUnauthenticated", name, err)
		}
		for _, ns := range c.Status(ctxFor(t, 10*time.Second), group) {
			if !errors.Is(ns.Err, chorus.ErrUnauthenticated) {
				t.Fatalf("%s: Status %s: %v, want ErrUnauthenticated", name, ns.Endpoint, ns.Err)
			}
		}
		for _, err := range c.Tail(ctxFor(t, 10*time.Second), group, 0) {
			if !errors.Is(err, chorus.ErrUnauthenticated) {
				t.Fatalf("%s: Tail: %v, want ErrUnauthenticated", name, err)
			}
			break
		}
	}
	// Without a client certificate the nodes refuse the connection (mutual TLS).
	c3 := dial(t, cl.endpoints, chorus.WithTLSCAFile(filepath.Join(tlsDir, "ca.pem")), chorus.WithTLSServerName("localhost"),
		chorus.WithToken(string(tok)), chorus.WithLeaderTimeout(300*time.Millisecond))
	out, err = c3.Append(ctxFor(t, 10*time.Second), group, payloads("no-client-cert", 1))
	if !errors.Is(err, chorus.ErrNoLeader) || out[0].State != chorus.Failed {
		t.Fatalf("Append without a client certificate: %v, %+v", err, out)
	}
	// Without the CA the nodes' certificates are not trusted: no connection, nothing
	// sent, so no leader.
	c2 := dial(t, cl.endpoints, chorus.WithToken(string(tok)), chorus.WithLeaderTimeout(300*time.Millisecond))
	out, err = c2.Append(ctxFor(t, 10*time.Second), group, payloads("untrusted", 1))
	if !errors.Is(err, chorus.ErrNoLeader) || out[0].State != chorus.Failed {
		t.Fatalf("Append without the CA: %v, %+v", err, out)
	}
}
