// Command etcd-raft-peer is one replica of a 3-node etcd-raft cluster used as a
// benchmark peer for Chorus. Each replica is its own OS process, persists its
// raft log in etcd's own WAL (fsync on), and talks to the other replicas over a
// small length-prefixed TCP transport. The leader (node 1) optionally runs
// closed-loop clients that wait for each proposal to be committed and applied
// before sending the next one.
//
// The Ready loop follows etcd's contrib/raftexample (raft.go, serveChannels):
//
//	wal.Save(rd.HardState, rd.Entries)  // fsync when entries / term / vote change
//	raftStorage.Append(rd.Entries)
//	transport.Send(rd.Messages)
//	publishEntries(rd.CommittedEntries) // here: wake the waiting client
//	node.Advance()
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

const (
	tickInterval  = 10 * time.Millisecond
	electionTick  = 100 // 1 s
	heartbeatTick = 10  // 100 ms
	keyLen        = 8   // proposal id prefix on every benchmark record
)

type peer struct {
	id   uint64
	addr string
	dir  string

	node      raft.Node
	storage   *raft.MemoryStorage
	wal       *wal.WAL
	transport *transport

	// leadership, maintained from Ready.SoftState
	lead      atomic.Uint64
	raftState atomic.Int32

	// proposal id -> waiting client, signalled from the apply path
	waitMu  sync.Mutex
	waiters map[uint64]chan struct{}

	appliedIndex uint64
	confState    raftpb.ConfState

	stopc chan struct{}
	donec chan struct{}
}

func main() {
	var (
		id         = flag.Uint64("id", 0, "this node's raft id (1-based index into --peers)")
		peersArg   = flag.String("peers", "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103", "comma-separated peer addresses; node i listens on the i-th")
		dataDir    = flag.String("data", "", "data directory (WAL lives in DIR/wal)")
		clients    = flag.Int("clients", 0, "closed-loop clients (leader/node 1 only)")
		size       = flag.Int("size", 512, "record size in bytes (includes the 8-byte proposal id prefix)")
		warmup     = flag.Duration("warmup", 2*time.Second, "warm-up interval, not measured")
		duration   = flag.Duration("duration", 10*time.Second, "measured interval")
		out        = flag.String("out", "", "write result JSON here (also printed to stdout)")
		quiet      = flag.Bool("quiet", true, "silence raft's info logging")
		samplePids = flag.String("sample-pids", "", "comma-separated pids of the other replicas, for OS accounting (leader only)")
	)
	flag.Parse()
	log.SetPrefix(fmt.Sprintf("[node %d] ", *id))
	log.SetFlags(log.Ltime | log.Lmicroseconds)

	addrs := strings.Split(*peersArg, ",")
	if *id < 1 || int(*id) > len(addrs) {
		log.Fatalf("--id must be in 1..%d", len(addrs))
	}
	if *dataDir == "" {
		log.Fatalf("--data is required")
	}
	if *size < keyLen {
		*size = keyLen
	}
	if *quiet {
		raft.SetLogger(quietLogger{&raft.DefaultLogger{Logger: log.New(os.Stderr, fmt.Sprintf("[raft %d] ", *id), log.Ltime|log.Lmicroseconds)}})
	}

	p := &peer{
		id:      *id,
		addr:    addrs[*id-1],
		dir:     *dataDir,
		storage: raft.NewMemoryStorage(),
		waiters: make(map[uint64]chan struct{}),
		stopc:   make(chan struct{}),
		donec:   make(chan struct{}),
	}

	restart := p.openWAL()

	rpeers := make([]raft.Peer, len(addrs))
	for i := range addrs {
		rpeers[i] = raft.Peer{ID: uint64(i + 1)}
	}
	c := &raft.Config{
		ID:                        p.id,
		ElectionTick:              electionTick,
		HeartbeatTick:             heartbeatTick,
		Storage:                   p.storage,
		MaxSizePerMsg:             1024 * 1024,
		MaxInflightMsgs:           256,
		MaxUncommittedEntriesSize: 1 << 30,
	}
	if restart {
		p.node = raft.RestartNode(c)
	} else {
		p.node = raft.StartNode(c, rpeers)
	}

	// The leader's peer connection closing means the benchmark is over.
	onLeaderGone := func() {
		if p.id != 1 {
			log.Printf("connection from leader closed; exiting")
			p.stop()
		}
	}
	p.transport = newTransport(p.id, addrs, p.node, onLeaderGone)
	if err := p.transport.listen(p.addr); err != nil {
		log.Fatalf("listen %s: %v", p.addr, err)
	}
	p.transport.start()

	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sigc
		log.Printf("got %v; exiting", s)
		p.stop()
	}()

	go p.serveRaft()

	if p.id == 1 {
		go p.campaignUntilLeader()
	}

	if p.id == 1 && *clients > 0 {
		pids := []int{os.Getpid()}
		for _, f := range strings.Split(*samplePids, ",") {
			if f == "" {
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				log.Fatalf("--sample-pids %q: %q is not a pid", *samplePids, f)
			}
			pids = append(pids, pid)
		}
		smp, err := newSampler(pids, *dataDir)
		if err != nil {
			log.Printf("OS accounting unavailable: %v", err)
		}
		res := p.runLoad(*clients, *size, *warmup, *duration, smp)
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
		if *out != "" {
			tmp := *out + ".tmp"
			if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
				log.Fatalf("write %s: %v", *out, err)
			}
			if err := os.Rename(tmp, *out); err != nil {
				log.Fatalf("rename %s: %v", *out, err)
			}
		}
		p.stop()
	}
	<-p.donec
	p.transport.close()
	p.wal.Close()
}

// quietLogger drops raft's Info/Debug chatter but keeps warnings and errors.
type quietLogger struct{ raft.Logger }

func (quietLogger) Debug(...interface{})          {}
func (quietLogger) Debugf(string, ...interface{}) {}
func (quietLogger) Info(...interface{})           {}
func (quietLogger) Infof(string, ...interface{})  {}

func (p *peer) stop() {
	select {
	case <-p.stopc:
	default:
		close(p.stopc)
	}
}

// openWAL follows raftexample's replayWAL: create a new WAL if none exists,
// otherwise open it, ReadAll, and load hard state + entries into MemoryStorage.
// Returns true if the node restarts from an existing WAL.
func (p *peer) openWAL() bool {
	walDir := p.dir + "/wal"
	lg := zap.NewNop()
	if !wal.Exist(walDir) {
		if err := os.MkdirAll(p.dir, 0o750); err != nil {
			log.Fatalf("mkdir %s: %v", p.dir, err)
		}
		w, err := wal.Create(lg, walDir, nil)
		if err != nil {
			log.Fatalf("wal.Create: %v", err)
		}
		p.wal = w
		return false
	}
	// No snapshots are taken in this benchmark, so open from the beginning.
	w, err := wal.Open(lg, walDir, walpb.Snapshot{})
	if err != nil {
		log.Fatalf("wal.Open: %v", err)
	}
	_, st, ents, err := w.ReadAll()
	if err != nil {
		log.Fatalf("wal.ReadAll: %v", err)
	}
	p.storage.SetHardState(st)
	p.storage.Append(ents)
	p.wal = w
	log.Printf("replayed WAL: term=%d commit=%d entries=%d", st.Term, st.Commit, len(ents))
	return true
}

// serveRaft is raftexample's serveChannels loop.
func (p *peer) serveRaft() {
	defer close(p.donec)
	ticker := time.NewTicker(tickInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			p.node.Tick()

		case rd := <-p.node.Ready():
			if rd.SoftState != nil {
				p.lead.Store(rd.SoftState.Lead)
				p.raftState.Store(int32(rd.SoftState.RaftState))
			}
			// 1. persist: Save fsyncs when there are entries or a term/vote change.
			if err := p.wal.Save(rd.HardState, rd.Entries); err != nil {
				log.Fatalf("wal.Save: %v", err)
			}
			if !raft.IsEmptySnap(rd.Snapshot) {
				// Never produced here (no compaction), but keep raftexample's shape.
				p.storage.ApplySnapshot(rd.Snapshot)
			}
			// 2. append to the in-memory raft log.
			p.storage.Append(rd.Entries)
			// 3. send messages to peers.
			p.transport.send(rd.Messages)
			// 4. apply committed entries.
			p.apply(rd.CommittedEntries)
			// 5. advance.
			p.node.Advance()

		case <-p.stopc:
			p.node.Stop()
			return
		}
	}
}

func (p *peer) apply(ents []raftpb.Entry) {
	if len(ents) == 0 {
		return
	}
	var woken []chan struct{}
	for i := range ents {
		e := &ents[i]
		if e.Index <= p.appliedIndex {
			continue
		}
		switch e.Type {
		case raftpb.EntryNormal:
			if len(e.Data) >= keyLen {
				woken = append(woken, p.takeWaiter(binary.BigEndian.Uint64(e.Data)))
			}
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			if err := cc.Unmarshal(e.Data); err != nil {
				log.Fatalf("unmarshal confchange: %v", err)
			}
			p.confState = *p.node.ApplyConfChange(cc)
		}
		p.appliedIndex = e.Index
	}
	for _, ch := range woken {
		if ch != nil {
			ch <- struct{}{}
		}
	}
}

func (p *peer) takeWaiter(key uint64) chan struct{} {
	p.waitMu.Lock()
	ch := p.waiters[key]
	if ch != nil {
		delete(p.waiters, key)
	}
	p.waitMu.Unlock()
	return ch
}

func (p *peer) isLeader() bool {
	return p.raftState.Load() == int32(raft.StateLeader)
}

// campaignUntilLeader makes node 1 the leader: campaign once every peer is
// reachable, and campaign again if some other node won or no election finished.
func (p *peer) campaignUntilLeader() {
	for !p.transport.allConnected() {
		select {
		case <-p.stopc:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	for {
		if !p.isLeader() {
			log.Printf("campaigning (current leader %d)", p.lead.Load())
			if err := p.node.Campaign(context.TODO()); err != nil && !errors.Is(err, raft.ErrStopped) {
				log.Printf("campaign: %v", err)
			}
		}
		// Re-check after a bit more than an election timeout.
		select {
		case <-p.stopc:
			return
		case <-time.After(1500 * time.Millisecond):
		}
		if p.isLeader() {
			return
		}
	}
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

// runLoad runs C closed-loop clients on the leader. A client proposes one
// record, waits until the apply loop sees that entry committed, then proposes
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
	hists := make([]*latHist, clients)
	for c := 0; c < clients; c++ {
		hists[c] = newLatHist()
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			h := hists[c]
			rng := rand.New(rand.NewPCG(uint64(c)+1, uint64(time.Now().UnixNano())))
			done := make(chan struct{}, 1)
			var seq uint64
			for !stopping.Load() {
				data := make([]byte, size)
				fillRandom(rng, data[keyLen:])
				t0 := time.Now()
				for {
					seq++
					key := uint64(c)<<40 | seq // unique client/seq id
					binary.BigEndian.PutUint64(data, key)
					p.waitMu.Lock()
					p.waiters[key] = done
					p.waitMu.Unlock()
					err := p.node.Propose(context.TODO(), data)
					if err == nil {
						select {
						case <-done:
						case <-time.After(5 * time.Second):
							err = errors.New("commit timeout")
						case <-p.stopc:
							return
						}
					}
					if err == nil {
						break
					}
					// Dropped (e.g. leadership lost) or timed out: retry with a new id.
					if p.takeWaiter(key) == nil {
						// Raced with the apply loop: it was committed after all.
						<-done
						break
					}
					retries.Add(1)
					if stopping.Load() {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
				t1 := time.Now()
				if !t0.Before(measureStart) && !t1.After(measureEnd) {
					h.record(t1.Sub(t0))
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
	for _, h := range hists {
		all.merge(h)
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
