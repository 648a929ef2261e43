package chorus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/chorus-log/chorus/clients/go/chorusv1"
)

// unary is one call on a stub; opts carry the trailer capture.
type unary func(ctx context.Context, stub chorusv1.ChorusClient, opts ...grpc.CallOption) error

// attempt is one call's result at one endpoint.
type attempt struct {
	err      error
	st       *status.Status
	trailer  metadata.MD
	timedOut bool // the client's call timeout (not the caller's context) cut it off
	// onWire: gRPC opened the call's stream on a connection (it fills in the peer only
	// then), so the request may have reached the node. A call that failed before (no
	// connection could be made: refused, a failed TLS handshake, no server preface, a
	// timeout while connecting) was never sent.
	onWire bool
}

// invoke runs call at endpoint i, bounded by the call timeout.
func (c *Client) invoke(ctx context.Context, i int, call unary) attempt {
	cctx, cancel := c.callCtx(ctx)
	defer cancel()
	var md metadata.MD
	var p peer.Peer
	err := call(cctx, c.stubs[i], grpc.Trailer(&md), grpc.Peer(&p))
	if err == nil {
		return attempt{}
	}
	st, _ := status.FromError(err)
	return attempt{
		err:      err,
		st:       st,
		trailer:  md,
		onWire:   p.Addr != nil,
		timedOut: ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded),
	}
}

func (a attempt) statusError(endpoint string) *StatusError {
	return &StatusError{Endpoint: endpoint, Code: a.st.Code(), Message: a.st.Message(), Trailer: a.trailer, sent: a.onWire}
}

// notSent reports whether a failed call surely did nothing: the server refused it marked
// NotStartedKey, or the connection could not be made, so gRPC never opened a stream for
// it (the Rust client's not_sent, which looks for "connection refused" and "tcp connect
// error": gRPC-Go tells it exactly, by the call's peer). Retrying it elsewhere cannot
// apply it twice.
func notSent(a attempt) bool {
	if len(a.trailer.Get(NotStartedKey)) > 0 || !a.onWire {
		return true
	}
	m := strings.ToLower(a.st.Message())
	return strings.Contains(m, "connection refused") ||
		strings.Contains(m, "tcp connect error") ||
		strings.Contains(m, "error while dialing") ||
		strings.Contains(m, "authentication handshake failed")
}

// onLeader runs a leader-only call, trying endpoints (the group's last known leader
// first) until one accepts, for up to the leader timeout. It is the Rust client's
// on_leader:
//
//   - FAILED_PRECONDITION (a follower, a leader handing over), and UNAVAILABLE or
//     UNKNOWN that surely did nothing (notSent), are refusals: the next endpoint is
//     tried (the one the chorus-leader trailer names, when its node is known).
//   - A call that is not idempotent and failed UNAVAILABLE, UNKNOWN, CANCELLED or
//     DEADLINE_EXCEEDED otherwise was cut off: it may have taken effect, so it ends
//     with an *IndeterminateError and is never retried.
//   - A refusal marked chorus-access-mode or chorus-refused, and every other code, ends
//     the call with a *StatusError (no other node would do better).
//
// It returns the endpoint index that answered.
func (c *Client) onLeader(ctx context.Context, group uint64, idempotent bool, call unary) (int, error) {
	n := len(c.stubs)
	start := time.Now()
	i := c.leaderIndex(group)
	last := ""
	for {
		for tries := 0; tries < n; tries++ {
			if err := ctx.Err(); err != nil {
				// Nothing in flight: every earlier attempt was a refusal.
				return i, fmt.Errorf("chorus: looking for group %d's leader (last answer: %s): %w", group, last, err)
			}
			a := c.invoke(ctx, i, call)
			if a.err == nil {
				c.setLeader(group, i)
				return i, nil
			}
			code := a.st.Code()
			if !a.onWire && (code == codes.Canceled || code == codes.DeadlineExceeded) {
				// Cut off while connecting, before anything was sent.
				if err := ctx.Err(); err != nil {
					return i, fmt.Errorf("chorus: looking for group %d's leader (last answer: %s): %w", group, last, err)
				}
				last = fmt.Sprintf("%s: %s", c.endpoints[i], a.st.Message())
				i = (i + 1) % n
				continue
			}
			if !idempotent && !notSent(a) &&
				(code == codes.Unavailable || code == codes.Unknown ||
					code == codes.Canceled || code == codes.DeadlineExceeded) {
				detail := a.st.Message()
				var cause error
				switch {
				case a.timedOut:
					detail = fmt.Sprintf("no answer within %v", c.cfg.callTimeout)
					cause = context.DeadlineExceeded
				case ctx.Err() != nil:
					detail = ctx.Err().Error()
					cause = ctx.Err()
				}
				return i, &IndeterminateError{Endpoint: c.endpoints[i], Detail: detail, Err: cause}
			}
			if (code == codes.FailedPrecondition || code == codes.Unavailable || code == codes.Unknown) &&
				len(a.trailer.Get(AccessModeKey)) == 0 && len(a.trailer.Get(RefusedKey)) == 0 {
				last = fmt.Sprintf("%s: %s", c.endpoints[i], a.st.Message())
				next := (i + 1) % n
				if code == codes.FailedPrecondition {
					if hint := a.trailer.Get(LeaderKey); len(hint) > 0 {
						var node uint64
						if _, err := fmt.Sscan(hint[0], &node); err == nil {
							if j, ok := c.nodeIndex(node); ok && j != i {
								next = j
							}
						}
					}
				}
				i = next
				continue
			}
			return i, a.statusError(c.endpoints[i])
		}
		waited := time.Since(start)
		if waited >= c.cfg.leaderTimeout {
			return i, &NoLeaderError{Group: group, Waited: waited, Last: last}
		}
		if err := sleep(ctx, retryPause); err != nil {
			return i, fmt.Errorf("chorus: looking for group %d's leader (last answer: %s): %w", group, last, err)
		}
	}
}

// readOrder is the order reads try endpoints in: the group's last known leader first
// (it has every record it acknowledged committed), then the others in order.
func (c *Client) readOrder(group uint64) []int {
	first := c.leaderIndex(group)
	order := make([]int, 0, len(c.stubs))
	order = append(order, first)
	for j := range c.stubs {
		if j != first {
			order = append(order, j)
		}
	}
	return order
}

// onAny runs an idempotent read on the first endpoint that answers: UNAVAILABLE moves
// to the next endpoint; any other error is returned as a *StatusError (the Rust
// client's on_any).
func (c *Client) onAny(ctx context.Context, group uint64, call unary) (int, error) {
	var last error = ErrNoEndpoints
	for _, i := range c.readOrder(group) {
		if err := ctx.Err(); err != nil {
			return i, err
		}
		a := c.invoke(ctx, i, call)
		if a.err == nil {
			return i, nil
		}
		if ctx.Err() != nil {
			return i, a.statusError(c.endpoints[i])
		}
		if a.st.Code() == codes.Unavailable {
			last = a.statusError(c.endpoints[i])
			continue
		}
		return i, a.statusError(c.endpoints[i])
	}
	return 0, last
}
