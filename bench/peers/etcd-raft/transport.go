package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// A deliberately small replacement for etcd's rafthttp.
//
// Every node dials every other node once and keeps that connection for the
// messages it sends to that peer (so each pair of nodes has two connections,
// one per direction). A connection starts with the sender's 8-byte node id,
// then carries frames of [4-byte big-endian length][raftpb.Message bytes].
// One writer goroutine per peer drains whatever is queued and writes it with a
// single flush; one reader goroutine per inbound connection hands each message
// to node.Step.

const (
	maxQueuedMsgs = 16384
	maxFrame      = 64 << 20
)

type transport struct {
	id           uint64
	addrs        []string
	node         raft.Node
	onLeaderGone func()

	ln      net.Listener
	out     map[uint64]*peerConn
	inbound []atomic.Bool // indexed by node id

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed chan struct{}
}

type peerConn struct {
	t         *transport
	id        uint64
	addr      string
	mu        sync.Mutex
	queue     []raftpb.Message
	notify    chan struct{}
	connected atomic.Bool
}

func newTransport(id uint64, addrs []string, node raft.Node, onLeaderGone func()) *transport {
	t := &transport{
		id:           id,
		addrs:        addrs,
		node:         node,
		onLeaderGone: onLeaderGone,
		out:          make(map[uint64]*peerConn),
		inbound:      make([]atomic.Bool, len(addrs)+1),
		conns:        make(map[net.Conn]struct{}),
		closed:       make(chan struct{}),
	}
	for i, a := range addrs {
		pid := uint64(i + 1)
		if pid == id {
			continue
		}
		t.out[pid] = &peerConn{t: t, id: pid, addr: a, notify: make(chan struct{}, 1)}
	}
	return t
}

func (t *transport) listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	t.ln = ln
	return nil
}

func (t *transport) start() {
	go t.acceptLoop()
	for _, pc := range t.out {
		go pc.writeLoop()
	}
}

func (t *transport) close() {
	select {
	case <-t.closed:
		return
	default:
		close(t.closed)
	}
	t.ln.Close()
	t.mu.Lock()
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
}

func (t *transport) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.closed:
		c.Close()
		return false
	default:
	}
	t.conns[c] = struct{}{}
	return true
}

func (t *transport) untrack(c net.Conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
	c.Close()
}

// allConnected reports whether this node has an outbound connection to every
// peer and every peer has connected to it.
func (t *transport) allConnected() bool {
	for pid, pc := range t.out {
		if !pc.connected.Load() || !t.inbound[pid].Load() {
			return false
		}
	}
	return true
}

// send queues messages for their peers; it never blocks on the network.
func (t *transport) send(msgs []raftpb.Message) {
	for _, m := range msgs {
		pc := t.out[m.To]
		if pc == nil {
			continue
		}
		pc.enqueue(m)
	}
}

func (pc *peerConn) enqueue(m raftpb.Message) {
	if !pc.connected.Load() {
		pc.unreachable()
		return
	}
	pc.mu.Lock()
	if len(pc.queue) >= maxQueuedMsgs {
		pc.mu.Unlock()
		pc.unreachable()
		return
	}
	pc.queue = append(pc.queue, m)
	pc.mu.Unlock()
	select {
	case pc.notify <- struct{}{}:
	default:
	}
}

// unreachable tells raft a message was dropped, as rafthttp does. Done in a
// goroutine so the Ready loop never waits on the raft node's channels.
func (pc *peerConn) unreachable() {
	go pc.t.node.ReportUnreachable(pc.id)
}

func (pc *peerConn) writeLoop() {
	var (
		batch []raftpb.Message
		buf   = make([]byte, 4, 64<<10)
	)
	for {
		conn := pc.dial()
		if conn == nil {
			return
		}
		w := bufio.NewWriterSize(conn, 1<<20)
		var hello [8]byte
		binary.BigEndian.PutUint64(hello[:], pc.t.id)
		if _, err := w.Write(hello[:]); err == nil {
			err = w.Flush()
		}
		pc.connected.Store(true)
		for {
			select {
			case <-pc.notify:
			case <-pc.t.closed:
				pc.connected.Store(false)
				pc.t.untrack(conn)
				return
			}
			pc.mu.Lock()
			batch, pc.queue = pc.queue, batch[:0]
			pc.mu.Unlock()
			var err error
			for i := range batch {
				n := batch[i].Size()
				if cap(buf) < 4+n {
					buf = make([]byte, 4+n)
				}
				buf = buf[:4+n]
				binary.BigEndian.PutUint32(buf, uint32(n))
				if _, err = batch[i].MarshalTo(buf[4:]); err != nil {
					log.Fatalf("marshal: %v", err)
				}
				if _, err = w.Write(buf); err != nil {
					break
				}
				batch[i] = raftpb.Message{} // drop references to entry data
			}
			if err == nil {
				err = w.Flush()
			}
			if err != nil {
				pc.connected.Store(false)
				pc.t.untrack(conn)
				select {
				case <-pc.t.closed:
					return
				default:
				}
				log.Printf("connection to %d (%s) lost: %v", pc.id, pc.addr, err)
				pc.unreachable()
				pc.mu.Lock()
				pc.queue = pc.queue[:0]
				pc.mu.Unlock()
				break
			}
		}
	}
}

func (pc *peerConn) dial() net.Conn {
	for {
		select {
		case <-pc.t.closed:
			return nil
		default:
		}
		c, err := net.DialTimeout("tcp", pc.addr, time.Second)
		if err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			if pc.t.track(c) {
				return c
			}
			return nil
		}
		select {
		case <-pc.t.closed:
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (t *transport) acceptLoop() {
	for {
		c, err := t.ln.Accept()
		if err != nil {
			select {
			case <-t.closed:
				return
			default:
			}
			log.Printf("accept: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !t.track(c) {
			return
		}
		go t.readLoop(c)
	}
}

func (t *transport) readLoop(c net.Conn) {
	defer t.untrack(c)
	r := bufio.NewReaderSize(c, 1<<20)
	var hello [8]byte
	if _, err := io.ReadFull(r, hello[:]); err != nil {
		return
	}
	from := binary.BigEndian.Uint64(hello[:])
	if from < 1 || int(from) >= len(t.inbound) {
		log.Printf("bad peer id %d", from)
		return
	}
	t.inbound[from].Store(true)
	defer func() {
		t.inbound[from].Store(false)
		if from == 1 {
			select {
			case <-t.closed:
			default:
				t.onLeaderGone()
			}
		}
	}()
	var (
		hdr  [4]byte
		body []byte
	)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if !errors.Is(err, io.EOF) {
				select {
				case <-t.closed:
				default:
					log.Printf("read from %d: %v", from, err)
				}
			}
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxFrame {
			log.Printf("frame from %d too large: %d", from, n)
			return
		}
		if cap(body) < int(n) {
			body = make([]byte, n)
		}
		body = body[:n]
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		// proto.Unmarshal copies bytes fields, so body can be reused.
		var m raftpb.Message
		if err := m.Unmarshal(body); err != nil {
			log.Printf("unmarshal from %d: %v", from, err)
			return
		}
		if err := t.node.Step(context.TODO(), m); err != nil {
			if errors.Is(err, raft.ErrStopped) {
				return
			}
		}
	}
}
