package chorus_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	chorus "github.com/chorus-log/chorus/clients/go"
)

// TestLeaderKilledDuringAppends kills -9 the leader's process while writers append
// concurrently: every record gets an explicit outcome, the client finds the new leader,
// every committed record is in the log at its LSN (with its CSN), no record is in the
// log twice (nothing was retried blindly), no Failed record is in the log, and a tail
// opened before the kill yields the log as it is afterwards.
func TestLeaderKilledDuringAppends(t *testing.T) {
	cl := startCluster(t)
	c := dial(t, cl.endpoints, chorus.WithLeaderTimeout(20*time.Second), chorus.WithCallTimeout(10*time.Second))
	ctx := ctxFor(t, 90*time.Second)
	leader, leaderEP, err := c.Leader(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d (%s) leads", leader, leaderEP)

	// A tail from the start, running through the kill.
	tailCtx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	var tailMu sync.Mutex
	var tailed []chorus.Record
	var tailErr error
	tailDone := make(chan struct{})
	go func() {
		defer close(tailDone)
		for rec, err := range c.Tail(tailCtx, group, 0) {
			tailMu.Lock()
			if err != nil {
				tailErr = err
				tailMu.Unlock()
				return
			}
			tailed = append(tailed, rec)
			tailMu.Unlock()
		}
	}()

	type sent struct {
		data    []byte
		outcome chorus.Outcome
		after   bool // sent after the kill
	}
	var (
		mu        sync.Mutex
		all       []sent
		killed    atomic.Bool
		stop      atomic.Bool
		committed atomic.Int64 // after the kill
	)
	const writers = 6
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; !stop.Load(); k++ {
				n := 1 + k%3
				recs := make([][]byte, n)
				for j := range recs {
					recs[j] = fmt.Appendf(nil, "w%d-%d-%d", w, k, j)
				}
				after := killed.Load()
				out, err := c.Append(ctx, group, recs)
				if len(out) != n {
					t.Errorf("writer %d: %d outcomes for %d records (err %v)", w, len(out), n, err)
					return
				}
				mu.Lock()
				for j, o := range out {
					all = append(all, sent{data: recs[j], outcome: o, after: after})
					if after && o.State == chorus.Committed {
						committed.Add(1)
					}
				}
				mu.Unlock()
				if err != nil {
					// Not every record committed (no leader yet, cut off by the kill):
					// a moment before the next request.
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}

	// Let them run, kill -9 the leader, and go on until appends commit at a new leader.
	time.Sleep(1500 * time.Millisecond)
	if err := syscall.Kill(cl.pidOf(t, leader), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed.Store(true)
	killedAt := time.Now()
	t.Logf("killed node %d (pid %d)", leader, cl.pidOf(t, leader))
	for committed.Load() < 200 && time.Since(killedAt) < 40*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if t.Failed() {
		return
	}
	if committed.Load() == 0 {
		t.Fatalf("nothing committed in %v after the leader was killed", time.Since(killedAt))
	}
	newEP, _ := c.KnownLeader(group)
	t.Logf("%d records committed after the kill, within %v; the client's leader is now %s",
		committed.Load(), time.Since(killedAt).Round(time.Millisecond), newEP)
	if newEP == leaderEP {
		t.Fatalf("the client still takes the killed node %s for the leader", leaderEP)
	}

	// Every outcome explicit.
	counts := map[chorus.State]int{}
	var maxLSN uint64
	for _, s := range all {
		o := s.outcome
		counts[o.State]++
		switch o.State {
		case chorus.Committed:
			if o.Err != nil || !o.Appended || o.LSN == 0 || o.CSN == 0 {
				t.Fatalf("%s: committed outcome %+v", s.data, o)
			}
			maxLSN = max(maxLSN, o.LSN)
		case chorus.Failed:
			if o.Err == nil || errors.Is(o.Err, chorus.ErrIndeterminate) {
				t.Fatalf("%s: failed outcome %+v", s.data, o)
			}
		case chorus.Unknown:
			if !errors.Is(o.Err, chorus.ErrIndeterminate) {
				t.Fatalf("%s: unknown outcome %+v does not match ErrIndeterminate", s.data, o)
			}
		default:
			t.Fatalf("%s: outcome %+v has no state", s.data, o)
		}
	}
	t.Logf("%d records: %d committed, %d failed, %d unknown", len(all), counts[chorus.Committed], counts[chorus.Failed], counts[chorus.Unknown])

	// The log as the surviving nodes hold it.
	log := readAll(t, c, maxLSN)
	at := map[uint64]chorus.Record{}
	times := map[string]int{}
	for _, r := range log {
		at[r.LSN] = r
		times[string(r.Data)]++
	}
	for _, s := range all {
		o := s.outcome
		switch o.State {
		case chorus.Committed:
			r, ok := at[o.LSN]
			if !ok || !bytes.Equal(r.Data, s.data) || r.CSN != o.CSN {
				t.Fatalf("%s committed at LSN %d CSN %d; the log holds %q CSN %d there (present: %v)",
					s.data, o.LSN, o.CSN, r.Data, r.CSN, ok)
			}
		case chorus.Failed:
			if times[string(s.data)] > 0 {
				t.Fatalf("%s failed (%v) but is in the log", s.data, o.Err)
			}
		}
		if times[string(s.data)] > 1 {
			t.Fatalf("%s is in the log %d times", s.data, times[string(s.data)])
		}
	}

	inLog, shown := 0, 0
	for _, s := range all {
		if s.outcome.State == chorus.Unknown {
			if times[string(s.data)] > 0 {
				inLog++
			}
			if shown++; shown <= 3 {
				t.Logf("unknown: %s: %v", s.data, s.outcome.Err)
			}
		}
	}
	t.Logf("%d of the %d unknown records are in the log", inLog, counts[chorus.Unknown])

	// The tail saw the same log, through the kill.
	end := log[len(log)-1].LSN
	for deadline := time.Now().Add(20 * time.Second); ; {
		tailMu.Lock()
		n, last, err := len(tailed), uint64(0), tailErr
		if n > 0 {
			last = tailed[n-1].LSN
		}
		tailMu.Unlock()
		if err != nil {
			t.Fatalf("the tail ended: %v", err)
		}
		if last >= end {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tail reached LSN %d of %d", last, end)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopTail()
	<-tailDone
	tailMu.Lock()
	defer tailMu.Unlock()
	if len(tailed) < len(log) {
		t.Fatalf("the tail yielded %d records, the log holds %d", len(tailed), len(log))
	}
	for i, r := range log {
		if tailed[i].LSN != r.LSN || tailed[i].CSN != r.CSN || !bytes.Equal(tailed[i].Data, r.Data) {
			t.Fatalf("tail record %d: LSN %d %q, the log has LSN %d %q", i, tailed[i].LSN, tailed[i].Data, r.LSN, r.Data)
		}
	}
}
