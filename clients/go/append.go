package chorus

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/chorus-log/chorus/clients/go/chorusv1"
)

// State is an appended record's outcome.
//
// The rule for sending a record again: a Failed record may be appended again (it is
// not in the log and never will be, so it cannot end up there twice); an Unknown
// record must not be appended again blindly (it may already be in the log): read the
// log at its LSN, if it has one, or around where it would be, to find out.
type State int

const (
	// Committed: the record is in the log at LSN, with CSN. Final.
	Committed State = iota + 1
	// Failed: the record is not in the log and never will be. Either it was never
	// appended (the request was refused before it could take effect: no leader found,
	// unauthenticated, the window full, an invalid record, the leader refusing the rest
	// of a request after taking its first records, ...) or it was appended at LSN and
	// its final result is FAILED (ErrNotCommitted). It may be sent again.
	Failed
	// Unknown: the record may or may not be in the log. The request was cut off before
	// its answer (the connection broke, the node shut down, a timeout), or the replica
	// appended it at LSN and stopped before it knew the outcome. Never retried blindly.
	Unknown
)

func (s State) String() string {
	switch s {
	case Committed:
		return "committed"
	case Failed:
		return "failed"
	case Unknown:
		return "unknown"
	}
	return "invalid"
}

// Outcome is one record's result of an Append.
type Outcome struct {
	State State
	// Appended is true when the record was given an LSN and CSN (always for Committed;
	// for Failed with ErrNotCommitted; for Unknown when the replica appended it and
	// stopped before it knew the outcome).
	Appended bool
	LSN, CSN uint64
	// Err says why, for Failed and Unknown (nil for Committed). Unknown outcomes match
	// ErrIndeterminate.
	Err error
}

// AppendOption configures one Append.
type AppendOption func(*chorusv1.AppendRequest)

// WithRefCSN makes every record's CSN at least csn (PALF section 4.2).
func WithRefCSN(csn uint64) AppendOption {
	return func(r *chorusv1.AppendRequest) { r.RefCsn = csn }
}

// Append appends records to the group, in order (one request: consecutive LSNs), at the
// group's leader, and waits for each one's final result. It returns one Outcome per
// record, always (unless records is empty), and a nil error exactly when every record
// committed; otherwise an *AppendError that counts the outcomes and wraps their causes
// (errors.Is(err, ErrIndeterminate), ErrNoLeader, ErrUnauthenticated, ...).
//
// Finding the leader, and what is retried (as the Rust client, crates/chorus-client):
//
//   - The group's last known leader is tried first, then the other endpoints in turn,
//     for up to the leader timeout (WithLeaderTimeout, 10 s by default, with a 50 ms
//     pause after each round). A follower answers FAILED_PRECONDITION, possibly naming
//     the leader's node id (used when Status has told which endpoint that node is).
//   - The request is sent to another endpoint only when the answer proves it did
//     nothing: FAILED_PRECONDITION (not the leader, or handing leadership over), an
//     UNAVAILABLE marked chorus-not-started (the group is not running on that node), or
//     a connection that could not be made (refused, a failed TLS handshake, timed out
//     while connecting: gRPC never opened a stream for the request). If no endpoint
//     takes it in time: every record Failed, ErrNoLeader; if ctx ends while looking:
//     every record Failed, ctx's error.
//   - A request cut off after it was sent, before its answer (UNAVAILABLE or UNKNOWN
//     without that mark — the connection broke, the node shut down under it —,
//     CANCELLED or DEADLINE_EXCEEDED from ctx, or no answer within the call timeout) is
//     indeterminate: every record Unknown, ErrIndeterminate. It is NEVER retried.
//   - Any other error (RESOURCE_EXHAUSTED: window full or disk low — retry after a
//     moment; INVALID_ARGUMENT; UNAUTHENTICATED; PERMISSION_DENIED; NOT_FOUND;
//     FAILED_PRECONDITION marked chorus-access-mode) is returned at once as a
//     *StatusError, every record Failed: the server refused the request before taking
//     it. (INTERNAL and other codes the server does not document for a refusal leave
//     the records Unknown, since the node may have written them before it failed.)
//
// When the leader answers, each record's result is its own: COMMITTED (Committed, with
// LSN and CSN); FAILED (Failed, ErrNotCommitted); unknown because the replica stopped
// before it knew (Unknown, with LSN and CSN, ErrIndeterminate); and records past the end
// of the answer, which the leader refused after taking the ones before them (Failed,
// ErrNotAppended). Append does not send Failed records again by itself.
func (c *Client) Append(ctx context.Context, group uint64, records [][]byte, opts ...AppendOption) ([]Outcome, error) {
	if len(records) == 0 {
		return nil, nil
	}
	req := &chorusv1.AppendRequest{Group: group, Records: records}
	for _, o := range opts {
		o(req)
	}
	var resp *chorusv1.AppendResponse
	i, err := c.onLeader(ctx, group, false, func(ctx context.Context, stub chorusv1.ChorusClient, opts ...grpc.CallOption) error {
		r, err := stub.Append(ctx, req, opts...)
		resp = r
		return err
	})
	out := make([]Outcome, len(records))
	if err != nil {
		state := Failed
		if mayHaveTakenEffect(err) {
			state = Unknown
		}
		for k := range out {
			out[k] = Outcome{State: state, Err: err}
		}
		return out, summarize(group, out)
	}
	results := resp.GetResults()
	for k := range out {
		if k >= len(results) {
			out[k] = Outcome{State: Failed, Err: ErrNotAppended}
			continue
		}
		r := results[k]
		o := Outcome{Appended: true, LSN: r.GetLsn(), CSN: r.GetCsn()}
		switch {
		case r.GetUnknown() != "":
			o.State = Unknown
			o.Err = &IndeterminateError{Endpoint: c.endpoints[i], Detail: r.GetUnknown(), Appended: true, LSN: o.LSN, CSN: o.CSN}
		case r.GetOutcome() == chorusv1.Outcome_COMMITTED:
			o.State = Committed
		case r.GetOutcome() == chorusv1.Outcome_FAILED:
			o.State = Failed
			o.Err = ErrNotCommitted
		default:
			// Neither known nor marked unknown: not something a server sends, but if
			// it did, the record may be in the log.
			o.State = Unknown
			o.Err = &IndeterminateError{Endpoint: c.endpoints[i], Detail: "the answer gave no outcome", Appended: true, LSN: o.LSN, CSN: o.CSN}
		}
		out[k] = o
	}
	return out, summarize(group, out)
}

// mayHaveTakenEffect reports whether a failed append call might have appended its
// records.
func mayHaveTakenEffect(err error) bool {
	if errors.Is(err, ErrIndeterminate) {
		return true
	}
	var se *StatusError
	if !errors.As(err, &se) {
		// No leader found, or the caller's context ended between attempts: every
		// attempt was a refusal.
		return false
	}
	if !se.sent || len(se.Trailer.Get(NotStartedKey)) > 0 {
		return false // never reached a node, or the node did nothing with it
	}
	switch se.Code {
	case codes.FailedPrecondition, codes.ResourceExhausted, codes.InvalidArgument,
		codes.NotFound, codes.Unimplemented, codes.Unauthenticated,
		codes.PermissionDenied, codes.OutOfRange, codes.AlreadyExists, codes.Aborted:
		return false
	}
	return true
}

// summarize is Append's error: nil when every record committed.
func summarize(group uint64, out []Outcome) error {
	e := &AppendError{Group: group}
	seen := map[string]bool{}
	for _, o := range out {
		switch o.State {
		case Committed:
			e.Committed++
			continue
		case Failed:
			e.Failed++
		default:
			e.Unknown++
		}
		key := ""
		var ie *IndeterminateError
		if errors.As(o.Err, &ie) && ie.Appended {
			key = "unknown:" + ie.Endpoint + ":" + ie.Detail
		} else {
			key = o.Err.Error()
		}
		if !seen[key] {
			seen[key] = true
			e.Errs = append(e.Errs, o.Err)
		}
	}
	if e.Committed == len(out) {
		return nil
	}
	return e
}
