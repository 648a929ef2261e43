// Command etcd-raft-peer is one replica of a 3-node etcd-raft cluster used as a
// benchmark peer for Chorus. Each replica is its own OS process, persists its
// raft log in etcd's own WAL (fsync on), and talks to the other replicas over a
// small length-prefixed TCP transport. The leader (node 1) optionally runs
// closed-loop clients that wait for each proposal to be committed before
// sending the next one.
//
// The Ready loop (ready.go) is ordered the way etcd's own server orders it: a
// leader sends its appends and heartbeats before its WAL write, so its fsync runs
// in parallel with the followers' (Raft thesis §10.2.1); every other message
// goes out only after the Ready's entries and hard state are durable. Committed
// entries are applied by their own goroutine, off the Ready loop.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.etcd.io/raft/v3"
	"go.uber.org/zap"
)

const (
	tickInterval  = 10 * time.Millisecond
	electionTick  = 100 // 1 s
	heartbeatTick = 10  // 100 ms
	keyLen        = 8   // proposal id prefix on every benchmark record

	// etcd server's own values (etcdserver/raft.go: maxSizePerMsg, maxInflightMsgs).
	maxSizePerMsg   = 1 << 20
	maxInflightMsgs = 4096 / 8
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

	applier  *applier
	proposer *proposer
	// slots[c] is client c's waiter (leader only; nil on followers). The apply
	// goroutine finds the slot from the proposal id, so there is no shared map.
	slots []clientSlot

	ctx    context.Context // cancelled on stop
	cancel context.CancelFunc
	stopc  chan struct{}
	donec  chan struct{}
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
	if *clients >= 1<<(64-clientShift) {
		log.Fatalf("--clients must be below %d", 1<<(64-clientShift))
	}
	if *quiet {
		raft.SetLogger(quietLogger{&raft.DefaultLogger{Logger: log.New(os.Stderr, fmt.Sprintf("[raft %d] ", *id), log.Ltime|log.Lmicroseconds)}})
	}

	ctx, cancel := context.WithCancel(context.Background())
	p := &peer{
		id:      *id,
		addr:    addrs[*id-1],
		dir:     *dataDir,
		storage: raft.NewMemoryStorage(),
		ctx:     ctx,
		cancel:  cancel,
		stopc:   make(chan struct{}),
		donec:   make(chan struct{}),
	}
	if *id == 1 && *clients > 0 {
		p.slots = newClientSlots(*clients)
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
		MaxSizePerMsg:             maxSizePerMsg,
		MaxInflightMsgs:           maxInflightMsgs,
		MaxUncommittedEntriesSize: 1 << 30,
		// etcd's server runs with both (etcdserver/bootstrap.go; --pre-vote defaults
		// to true): a follower that misses heartbeats for a moment cannot depose a
		// leader the others still hear from.
		CheckQuorum: true,
		PreVote:     true,
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

	p.applier = newApplier(p)
	go p.applier.run()
	go p.serveRaft()

	if p.id == 1 {
		go p.campaignUntilLeader()
	}

	if p.id == 1 && *clients > 0 {
		p.proposer = newProposer(p)

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
		p.cancel()
	}
}

// openWAL follows raftexample's replayWAL: create a new WAL if none exists,
// otherwise open it, ReadAll, and load hard state + entries into MemoryStorage.
// Returns true if the node restarts from an existing WAL. wal.Create and every
// segment cut preallocate the 64 MB segment file (fallocate); that is built into
// etcd's WAL and cannot be turned off.
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
			if lead := p.lead.Load(); lead != raft.None {
				// Another node leads: with check-quorum the others would refuse our
				// (pre-)votes, so ask the leader to hand over instead.
				log.Printf("asking leader %d to transfer leadership", lead)
				p.node.TransferLeadership(p.ctx, lead, p.id)
			} else {
				log.Printf("campaigning")
				if err := p.node.Campaign(p.ctx); err != nil && !errors.Is(err, raft.ErrStopped) && !errors.Is(err, context.Canceled) {
					log.Printf("campaign: %v", err)
				}
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
