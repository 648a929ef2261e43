package main

import (
	"encoding/binary"
	"errors"
	"log"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Every benchmark record starts with an 8-byte proposal id, client<<clientShift | seq
// (seq starts at 1, so an id is never 0).
const clientShift = 40

// clientSlot is one closed-loop client's waiter: the id of the proposal it waits
// for (0: none) and the channel the apply goroutine signals. Per client, so waking
// a client takes no lock; padded so neighbouring slots do not share a cache line.
type clientSlot struct {
	want atomic.Uint64
	done chan struct{}
	_    [48]byte
}

func newClientSlots(n int) []clientSlot {
	s := make([]clientSlot, n)
	for i := range s {
		s[i].done = make(chan struct{}, 1)
	}
	return s
}

// wake signals the client waiting for proposal id key, if any. Called by the apply
// goroutine for every committed record.
func (p *peer) wake(key uint64) {
	c := key >> clientShift
	if c >= uint64(len(p.slots)) {
		return
	}
	s := &p.slots[c]
	if s.want.CompareAndSwap(key, 0) {
		s.done <- struct{}{} // capacity 1, and the client has one proposal in flight
	}
}

// proposer batches the clients' records into one MsgProp per hand-off to the raft
// node. Whoever holds the stepping token hands raft everything queued; while one
// batch is handed over, the next accumulates. A client that finds nobody stepping
// steps its own record (plus anything queued) itself, so one client pays no extra
// goroutine hop; a queue left behind goes to the proposer goroutine, so no client
// is kept stepping other clients' records. With 1,000 clients this makes one
// MsgProp with many entries, appended to the leader's log at once and sent in one
// MsgApp per follower, instead of 1,000 Propose calls that each wait for the raft
// goroutine.
type proposer struct {
	p        *peer
	mu       sync.Mutex
	buf      []raftpb.Entry
	stepping bool
	wake     chan struct{}
}

func newProposer(p *peer) *proposer {
	pr := &proposer{p: p, wake: make(chan struct{}, 1)}
	go pr.run()
	return pr
}

func (pr *proposer) add(data []byte) {
	e := raftpb.Entry{Data: data}
	pr.mu.Lock()
	pr.buf = append(pr.buf, e)
	if pr.stepping {
		pr.mu.Unlock() // the holder steps it
		return
	}
	pr.stepping = true
	batch := pr.takeLocked()
	pr.mu.Unlock()
	pr.step(batch)
	pr.mu.Lock()
	pr.stepping = false
	left := len(pr.buf) > 0
	pr.mu.Unlock()
	if left {
		select {
		case pr.wake <- struct{}{}:
		default:
		}
	}
}

func (pr *proposer) run() {
	for {
		select {
		case <-pr.wake:
		case <-pr.p.stopc:
			return
		}
		pr.mu.Lock()
		if pr.stepping {
			pr.mu.Unlock() // the holder wakes us again if it leaves a queue
			continue
		}
		pr.stepping = true
		for len(pr.buf) > 0 {
			batch := pr.takeLocked()
			pr.mu.Unlock()
			pr.step(batch)
			pr.mu.Lock()
		}
		pr.stepping = false
		pr.mu.Unlock()
	}
}

func (pr *proposer) takeLocked() []raftpb.Entry {
	batch := pr.buf
	pr.buf = make([]raftpb.Entry, 0, len(batch)) // the raft goroutine may still hold batch
	return batch
}

// step hands a batch to raft. A proposal that raft drops (no leader, or not the
// leader) is not reported; its client times out and proposes it again. Step fails
// only once the node is stopped, when the batch is moot.
func (pr *proposer) step(batch []raftpb.Entry) {
	_ = pr.p.node.Step(pr.p.ctx, raftpb.Message{Type: raftpb.MsgProp, Entries: batch})
}

type result struct {
	System        string  `json:"system"`
	Clients       int     `json:"clients"`
	Size          int     `json:"size"`
	Appends       int64   `json:"appends"`
	Seconds       float64 `json:"seconds"`
	AppendsPerSec float64 `json:"appends_per_sec"`
	MBPerSec      float64 `json:"mb_per_sec"`
	P50us         int64   `json:"p50_us"`
	P99us         int64   `json:"p99_us"`
	P999us        int64   `json:"p999_us"`
	MaxUs         int64   `json:"max_us"`
	Retries       int64   `json:"retries"`
	// The shared result schema (docs/benchmarks/result-fields.md); null when unknown.
	Path               string   `json:"path"`
	CommitMode         *string  `json:"commit_mode"`
	Replicas           int      `json:"replicas"`
	ProcWriteBytes     []uint64 `json:"proc_write_bytes"`
	WriteAmp           *float64 `json:"write_amp"`
	CPUSeconds         *float64 `json:"cpu_seconds"`
	CPUSecPerMillion   *float64 `json:"cpu_sec_per_million"`
	DevWriteBytes      *uint64  `json:"dev_write_bytes"`
	DevWriteReqsPerSec *float64 `json:"dev_write_reqs_per_sec"`
	DevFlushesPerSec   *float64 `json:"dev_flushes_per_sec"`
	DevWriteMBPerSec   *float64 `json:"dev_write_mb_per_sec"`
	FsyncsPerSec       *float64 `json:"fsyncs_per_sec"`
	FollowerMsgsPerSec *float64 `json:"follower_msgs_per_sec"`
}

const (
	commitTimeout = 5 * time.Second
	histShards    = 64
)

type histShard struct {
	mu sync.Mutex
	h  *latHist
	_  [48]byte
}

// runLoad runs C closed-loop clients on the leader. A client proposes one
// record, waits until the apply goroutine sees that entry committed, then proposes
// the next. Only appends that both start and finish inside the measured window
// are counted.
func (p *peer) runLoad(clients, size int, warmup, duration time.Duration, smp *sampler) result {
	for !(p.isLeader() && p.transport.allConnected()) {
		select {
		case <-p.stopc:
			log.Fatalf("stopped before becoming leader")
		case <-time.After(10 * time.Millisecond):
		}
	}
	log.Printf("leader with all peers connected; starting %d clients, %d-byte records", clients, size)

	start := time.Now()
	measureStart := start.Add(warmup)
	measureEnd := measureStart.Add(duration)

	var (
		stopping atomic.Bool
		retries  atomic.Int64
		wg       sync.WaitGroup
	)
	// Latency histograms, sharded by client: a full-range HDR histogram is ~200 KB,
	// too much to keep one per client at thousands of clients, and one shared
	// histogram would put every client behind one lock.
	hists := make([]histShard, min(clients, histShards))
	for i := range hists {
		hists[i].h = newLatHist()
	}
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			h := &hists[c%len(hists)]
			slot := &p.slots[c]
			rng := rand.New(rand.NewPCG(uint64(c)+1, uint64(time.Now().UnixNano())))
			timer := time.NewTimer(commitTimeout)
			defer timer.Stop()
			var seq uint64
			for !stopping.Load() {
				data := make([]byte, size)
				fillRandom(rng, data[keyLen:])
				t0 := time.Now()
				for {
					seq++
					key := uint64(c)<<clientShift | seq // unique client/seq id
					binary.BigEndian.PutUint64(data, key)
					slot.want.Store(key)
					p.proposer.add(data)
					timer.Reset(commitTimeout)
					var err error
					select {
					case <-slot.done:
					case <-timer.C:
						err = errors.New("commit timeout")
					case <-p.stopc:
						return
					}
					if err == nil {
						break
					}
					// Dropped (e.g. leadership lost) or late: withdraw and retry with a
					// new id, unless the apply goroutine took the slot first.
					if !slot.want.CompareAndSwap(key, 0) {
						<-slot.done // committed after all
						break
					}
					retries.Add(1)
					if stopping.Load() {
						return
					}
					time.Sleep(10 * time.Millisecond)
					// The old proposal may still be in raft's log: never reuse its bytes.
					data = append([]byte(nil), data...)
				}
				t1 := time.Now()
				if !t0.Before(measureStart) && !t1.After(measureEnd) {
					h.mu.Lock()
					h.h.record(t1.Sub(t0))
					h.mu.Unlock()
				}
			}
		}(c)
	}

	var s0, s1 sample
	var sampleErr error
	if smp == nil {
		sampleErr = errors.New("no sampler")
	}
	select {
	case <-time.After(time.Until(measureStart)):
		if smp != nil {
			s0, sampleErr = smp.sample()
		}
	case <-p.stopc:
		log.Printf("stopped during the run; no result")
		os.Exit(1)
	}
	select {
	case <-time.After(time.Until(measureEnd)):
		if sampleErr == nil {
			s1, sampleErr = smp.sample()
		}
	case <-p.stopc:
		log.Printf("stopped during the run; no result")
		os.Exit(1)
	}
	stopping.Store(true)
	// Give in-flight appends a moment to finish; they are outside the window anyway.
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(2 * time.Second):
	}

	all := newLatHist()
	for i := range hists {
		hists[i].mu.Lock()
		all.merge(hists[i].h)
		hists[i].mu.Unlock()
	}
	secs := duration.Seconds()
	n := all.count()
	res := result{
		Path:          "embedded",
		Replicas:      3,
		System:        "etcd-raft",
		Clients:       clients,
		Size:          size,
		Appends:       n,
		Seconds:       secs,
		AppendsPerSec: float64(n) / secs,
		MBPerSec:      float64(n) * float64(size) / secs / 1e6,
		P50us:         all.quantileUs(50),
		P99us:         all.quantileUs(99),
		P999us:        all.quantileUs(99.9),
		MaxUs:         all.maxUs(),
		Retries:       retries.Load(),
	}
	if sampleErr == nil {
		res.fill(s0, s1, n, size)
	} else {
		log.Printf("OS accounting failed: %v", sampleErr)
	}
	return res
}

func fillRandom(rng *rand.Rand, b []byte) {
	for len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, rng.Uint64())
		b = b[8:]
	}
	if len(b) > 0 {
		var tmp [8]byte
		binary.LittleEndian.PutUint64(tmp[:], rng.Uint64())
		copy(b, tmp[:])
	}
}
