package chorus

import (
	"context"
	"errors"
	"io"
	"iter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/chorus-log/chorus/clients/go/chorusv1"
)

// Record is a committed record of a group's log.
type Record struct {
	// LSN is the record's position (a byte offset in the log: LSNs grow, but not by
	// one).
	LSN uint64
	// CSN is its commit sequence number.
	CSN  uint64
	Data []byte
}

// ReadResult is what one Read returns.
type ReadResult struct {
	Records []Record
	// NextLSN is where to continue reading.
	NextLSN uint64
	// CommittedEnd is the committed end of the log when the node answered.
	CommittedEnd uint64
}

func records(pb []*chorusv1.Record) []Record {
	out := make([]Record, len(pb))
	for i, r := range pb {
		out[i] = Record{LSN: r.GetLsn(), CSN: r.GetCsn(), Data: r.GetData()}
	}
	return out
}

// Read reads committed records of the group from fromLSN (0, a record's LSN, or a
// NextLSN from an earlier read), at most maxRecords of them (0: the server's default,
// 1000). It asks the group's last known leader first (it has every record it
// acknowledged), then any other node: UNAVAILABLE moves on to the next endpoint. A
// follower may be behind: it answers the records it knows are committed.
//
// Errors: ErrOutOfRange (fromLSN not yet committed, or trimmed), ErrNotFound (no such
// group, or fromLSN is not a record), ErrUnavailable (no node answered), and the
// authentication errors.
func (c *Client) Read(ctx context.Context, group, fromLSN uint64, maxRecords uint32) (*ReadResult, error) {
	var resp *chorusv1.ReadResponse
	req := &chorusv1.ReadRequest{Group: group, FromLsn: fromLSN, MaxRecords: maxRecords}
	_, err := c.onAny(ctx, group, func(ctx context.Context, stub chorusv1.ChorusClient, opts ...grpc.CallOption) error {
		r, err := stub.Read(ctx, req, opts...)
		resp = r
		return err
	})
	if err != nil {
		return nil, err
	}
	return &ReadResult{Records: records(resp.GetRecords()), NextLSN: resp.GetNextLsn(), CommittedEnd: resp.GetCommittedEnd()}, nil
}

// Locate finds the first committed record of the group whose CSN is at least csn: its
// LSN, and whether there is one.
func (c *Client) Locate(ctx context.Context, group, csn uint64) (lsn uint64, found bool, err error) {
	var resp *chorusv1.LocateResponse
	req := &chorusv1.LocateRequest{Group: group, Csn: csn}
	_, err = c.onAny(ctx, group, func(ctx context.Context, stub chorusv1.ChorusClient, opts ...grpc.CallOption) error {
		r, err := stub.Locate(ctx, req, opts...)
		resp = r
		return err
	})
	if err != nil {
		return 0, false, err
	}
	return resp.GetLsn(), resp.GetFound(), nil
}

// Tail streams the group's committed records from fromLSN on, in LSN order, and waits
// for new ones: a long poll that runs until ctx is done or the loop breaks.
//
//	for rec, err := range client.Tail(ctx, 1, 0) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(rec.LSN, string(rec.Data))
//	}
//
// It is served by the group's last known leader first, else by any node. Reading is
// idempotent, so when its stream breaks (UNAVAILABLE: the node died or shut down, or
// the group stopped there; OUT_OF_RANGE from a node that has not yet caught up with
// where the stream left off) Tail opens it again from the next LSN at the next
// endpoint: no record is skipped or yielded twice. It gives up, yielding the error,
// when no endpoint serves it for the leader timeout; any other error (ErrNotFound,
// ErrUnauthenticated, ...) is yielded at once. Once ctx is done it yields ctx's error
// (context.Canceled or context.DeadlineExceeded) and stops. After an error the
// iteration ends.
func (c *Client) Tail(ctx context.Context, group, fromLSN uint64) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		next := fromLSN
		order := c.readOrder(group)
		pos := 0
		var failingSince time.Time
		// Since when replicas have refused the position OUT_OF_RANGE with no record in
		// between: a refusing node still takes the stream (its headers reset
		// failingSince), so this bounds a lag, or a trim everywhere, by itself.
		var laggingSince time.Time
		resumed := false
		for {
			if err := ctx.Err(); err != nil {
				yield(Record{}, err)
				return
			}
			i := order[pos%len(order)]
			before := next
			a, stop := c.tailOnce(ctx, i, group, &next, &failingSince, yield)
			if stop {
				return
			}
			if err := ctx.Err(); err != nil {
				yield(Record{}, err)
				return
			}
			code := a.st.Code()
			retry := code == codes.Unavailable || code == codes.Unknown || code == codes.Internal ||
				(code == codes.OutOfRange && (resumed || next != fromLSN))
			if !retry {
				yield(Record{}, a.statusError(c.endpoints[i]))
				return
			}
			if next != before || code != codes.OutOfRange {
				laggingSince = time.Time{}
			} else if laggingSince.IsZero() {
				laggingSince = time.Now()
			} else if time.Since(laggingSince) >= c.cfg.leaderTimeout {
				yield(Record{}, a.statusError(c.endpoints[i]))
				return
			}
			resumed = true
			if failingSince.IsZero() {
				failingSince = time.Now()
			} else if time.Since(failingSince) >= c.cfg.leaderTimeout {
				yield(Record{}, a.statusError(c.endpoints[i]))
				return
			}
			pos++
			if pos%len(order) == 0 {
				if err := sleep(ctx, retryPause); err != nil {
					yield(Record{}, err)
					return
				}
			}
		}
	}
}

// tailOnce runs one Tail stream at endpoint i, yielding its records and moving next on.
// It returns why the stream ended, or stop when the consumer stopped.
func (c *Client) tailOnce(ctx context.Context, i int, group uint64, next *uint64, failingSince *time.Time,
	yield func(Record, error) bool) (a attempt, stop bool) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.stubs[i].Tail(sctx, &chorusv1.TailRequest{Group: group, FromLsn: *next})
	if err == nil {
		// The node took the stream once its headers come back: it serves. (An error
		// answered at once comes back without headers, as trailers only.)
		var md metadata.MD
		if md, err = stream.Header(); err == nil && md != nil {
			*failingSince = time.Time{}
		}
	}
	for err == nil {
		var resp *chorusv1.ReadResponse
		resp, err = stream.Recv()
		if err != nil {
			break
		}
		*failingSince = time.Time{}
		for _, r := range resp.GetRecords() {
			if r.GetLsn() < *next {
				continue // never yield a record twice
			}
			if !yield(Record{LSN: r.GetLsn(), CSN: r.GetCsn(), Data: r.GetData()}, nil) {
				return attempt{}, true
			}
		}
		if resp.GetNextLsn() > *next {
			*next = resp.GetNextLsn()
		}
	}
	if errors.Is(err, io.EOF) {
		// The server ended the stream without an error: open it again.
		err = status.Error(codes.Unavailable, "the tail stream ended")
	}
	st, _ := status.FromError(err)
	a = attempt{err: err, st: st}
	if stream != nil {
		a.trailer = stream.Trailer()
	}
	return a, false
}
