package main

import (
	"encoding/binary"
	"log"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// serveRaft is the Ready loop. Per Ready, in this order (etcd's etcdserver/raft.go
// order, written for this peer):
//
//  1. hand rd.CommittedEntries to the apply goroutine (never waits);
//  2. leader only: send the replication messages (MsgApp, MsgHeartbeat), so the
//     followers write and fsync while the leader does (Raft thesis §10.2.1);
//  3. wal.Save(rd.HardState, rd.Entries): fsync when there are entries or the
//     term/vote changed;
//  4. raftStorage.Append(rd.Entries);
//  5. send every other message: all of a follower's or candidate's messages
//     (MsgAppResp, MsgVote, MsgVoteResp, ...) and whatever a leader did not send
//     in step 2. A message that acknowledges something therefore always leaves
//     after the state it acknowledges is durable;
//  6. node.Advance().
//
// Leader's commit stays behind its own fsync: in synchronous-storage mode the
// raft library counts the leader's own copy of an entry only when Advance is
// called (its self-MsgAppResp is stepped on Advance), so an entry is committed,
// and a client answered, only once it is durable on the leader and on a follower.
func (p *peer) serveRaft() {
	defer close(p.donec)
	ticker := time.NewTicker(tickInterval)
	defer ticker.Stop()
	leader := false
	var early, late []raftpb.Message
	for {
		select {
		case <-ticker.C:
			p.node.Tick()

		case rd := <-p.node.Ready():
			if rd.SoftState != nil {
				p.lead.Store(rd.SoftState.Lead)
				p.raftState.Store(int32(rd.SoftState.RaftState))
				leader = rd.SoftState.RaftState == raft.StateLeader
			}

			// 1. apply runs on its own goroutine; a batch with a configuration
			// change hands back a channel closed once it is applied.
			confApplied := p.applier.push(rd.CommittedEntries)

			// 2. leader: replicate before the local write.
			early, late = early[:0], late[:0]
			if leader {
				for i := range rd.Messages {
					switch rd.Messages[i].Type {
					case raftpb.MsgApp, raftpb.MsgHeartbeat:
						early = append(early, rd.Messages[i])
					default:
						late = append(late, rd.Messages[i])
					}
				}
				p.transport.send(early)
			} else {
				late = append(late, rd.Messages...)
			}

			// 3. persist.
			if !raft.IsEmptySnap(rd.Snapshot) {
				// The log is never compacted, so no leader ever sends a snapshot.
				log.Fatalf("unexpected snapshot at index %d", rd.Snapshot.Metadata.Index)
			}
			if err := p.wal.Save(rd.HardState, rd.Entries); err != nil {
				log.Fatalf("wal.Save: %v", err)
			}
			// 4. in-memory raft log.
			p.storage.Append(rd.Entries)

			// Configuration changes (only the three bootstrap entries here) are
			// applied before anything else is sent or the node advances, as etcd
			// does, so votes are never counted against a stale configuration.
			if confApplied != nil {
				select {
				case <-confApplied:
				case <-p.stopc:
					p.node.Stop()
					return
				}
			}

			// 5. everything else, after the write.
			p.transport.send(coalesceAppResps(late))

			// 6.
			p.node.Advance()

		case <-p.stopc:
			p.node.Stop()
			return
		}
	}
}

// coalesceAppResps keeps only the last MsgAppResp to each destination: a later
// response from the same Ready covers an earlier one (etcd's server drops the
// earlier ones too). The order of the remaining messages is kept.
func coalesceAppResps(msgs []raftpb.Message) []raftpb.Message {
	n := 0
	for i := range msgs {
		if msgs[i].Type == raftpb.MsgAppResp {
			n++
		}
	}
	if n < 2 {
		return msgs
	}
	out := msgs[:0:0]
	for i := range msgs {
		m := msgs[i]
		if m.Type == raftpb.MsgAppResp {
			superseded := false
			for j := i + 1; j < len(msgs); j++ {
				if msgs[j].Type == raftpb.MsgAppResp && msgs[j].To == m.To {
					superseded = true
					break
				}
			}
			if superseded {
				continue
			}
		}
		out = append(out, m)
	}
	return out
}

// applier applies committed entries in index order on its own goroutine. The
// Ready loop only appends to its queue, so it never waits for clients to be woken.
type applier struct {
	p     *peer
	mu    sync.Mutex
	queue []applyBatch
	wake  chan struct{}

	applied uint64 // apply goroutine only
}

type applyBatch struct {
	ents []raftpb.Entry
	done chan struct{} // non-nil if the batch holds a configuration change
}

func newApplier(p *peer) *applier {
	return &applier{p: p, wake: make(chan struct{}, 1)}
}

// push queues committed entries; it returns a channel closed once they are
// applied if they include a configuration change, else nil.
func (a *applier) push(ents []raftpb.Entry) chan struct{} {
	if len(ents) == 0 {
		return nil
	}
	var done chan struct{}
	for i := range ents {
		if t := ents[i].Type; t == raftpb.EntryConfChange || t == raftpb.EntryConfChangeV2 {
			done = make(chan struct{})
			break
		}
	}
	a.mu.Lock()
	a.queue = append(a.queue, applyBatch{ents: ents, done: done})
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return done
}

func (a *applier) run() {
	var batches []applyBatch
	for {
		select {
		case <-a.wake:
		case <-a.p.stopc:
			return
		}
		a.mu.Lock()
		batches, a.queue = a.queue, batches[:0]
		a.mu.Unlock()
		for i := range batches {
			a.apply(batches[i].ents)
			if batches[i].done != nil {
				close(batches[i].done)
			}
			batches[i] = applyBatch{}
		}
	}
}

func (a *applier) apply(ents []raftpb.Entry) {
	for i := range ents {
		e := &ents[i]
		idx := e.Index
		if idx <= a.applied {
			continue // re-delivered after a restart
		}
		if idx != a.applied+1 {
			log.Fatalf("apply: gap: entry %d after %d", idx, a.applied)
		}
		switch e.Type {
		case raftpb.EntryNormal:
			if len(e.Data) >= keyLen {
				a.p.wake(binary.BigEndian.Uint64(e.Data))
			}
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			if err := cc.Unmarshal(e.Data); err != nil {
				log.Fatalf("unmarshal confchange: %v", err)
			}
			a.p.node.ApplyConfChange(cc)
		case raftpb.EntryConfChangeV2:
			var cc raftpb.ConfChangeV2
			if err := cc.Unmarshal(e.Data); err != nil {
				log.Fatalf("unmarshal confchange v2: %v", err)
			}
			a.p.node.ApplyConfChange(cc)
		}
		a.applied = idx
	}
}
