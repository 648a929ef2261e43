package chorus

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Sentinel errors. Every error this package returns can be tested with [errors.Is]
// against them; the concrete types ([*StatusError], [*NoLeaderError],
// [*IndeterminateError], [*AppendError], [*BadEndpointError]) carry the details and can be
// taken out with [errors.As].
var (
	// ErrNoEndpoints: Dial was given no endpoints.
	ErrNoEndpoints = errors.New("chorus: no endpoints given")
	// ErrBadEndpoint: an endpoint is not host:port, http://host:port or https://host:port.
	ErrBadEndpoint = errors.New("chorus: bad endpoint")
	// ErrBadToken: the bearer token is empty or not printable ASCII (it is sent as an HTTP
	// header).
	ErrBadToken = errors.New("chorus: the token is not printable ASCII (a bearer token is sent as an HTTP header)")
	// ErrBadTLS: the TLS files could not be read or hold no PEM of what they should, or a
	// client certificate was given without its key (or the key without the certificate).
	ErrBadTLS = errors.New("chorus: bad TLS settings")

	// ErrNoLeader: no endpoint accepted a leader-only operation (an append) within the
	// leader timeout ([WithLeaderTimeout]). Every answer was a refusal that left the
	// request untaken (a follower, a leader handing over, an unreachable node), so the
	// records were not appended and may be sent again.
	ErrNoLeader = errors.New("chorus: no leader found")
	// ErrIndeterminate: a non-idempotent request (an append) was cut off before its
	// answer — the connection broke, the node shut down under it, the call timeout
	// ([WithCallTimeout]) or the caller's context expired — or the replica stopped before
	// it knew an appended record's outcome. The record may or may not be in the log:
	// read the log to find out; never append it again blindly (that could append it
	// twice).
	ErrIndeterminate = errors.New("chorus: outcome unknown")
	// ErrNotCommitted: the record was appended (it has an LSN) but its final result is
	// FAILED: it is not in the log and never will be, so appending it again cannot
	// duplicate it.
	ErrNotCommitted = errors.New("chorus: appended but not committed (final)")
	// ErrNotAppended: the leader took the records before this one in the same request
	// and refused this one (it stepped down, or its window filled); this record and the
	// ones after it were not appended and may be sent again.
	ErrNotAppended = errors.New("chorus: not appended (the leader refused it after taking earlier records of the request)")

	// ErrUnauthenticated: the node needs a bearer token ([WithToken]) and got none or one
	// it does not know (gRPC UNAUTHENTICATED).
	ErrUnauthenticated = errors.New("chorus: unauthenticated")
	// ErrPermissionDenied: the token's identity may not do this, or not on this group
	// (gRPC PERMISSION_DENIED).
	ErrPermissionDenied = errors.New("chorus: permission denied")
	// ErrNotFound: no such group on the node, or the LSN is not a record (NOT_FOUND).
	ErrNotFound = errors.New("chorus: not found")
	// ErrOutOfRange: the LSN is not yet committed, or trimmed (OUT_OF_RANGE).
	ErrOutOfRange = errors.New("chorus: out of range")
	// ErrResourceExhausted: the leader's replication window is full, its disk is low or
	// its queue is busy; nothing was appended: retry after a moment (RESOURCE_EXHAUSTED).
	ErrResourceExhausted = errors.New("chorus: resource exhausted (retry after a moment)")
	// ErrInvalidArgument: a bad request, e.g. a record too large (INVALID_ARGUMENT).
	ErrInvalidArgument = errors.New("chorus: invalid argument")
	// ErrUnimplemented: the operation does not exist for the group's mode (UNIMPLEMENTED).
	ErrUnimplemented = errors.New("chorus: unimplemented for this group")
	// ErrUnavailable: no endpoint could answer (UNAVAILABLE): nodes down or the group
	// stopped.
	ErrUnavailable = errors.New("chorus: unavailable")
	// ErrAccessMode: the leader refused a write its group's access mode does not take (an
	// append to a mirror, or either write while a switch is under way); nothing was
	// written and no other node would take it (FAILED_PRECONDITION with the
	// chorus-access-mode trailer).
	ErrAccessMode = errors.New("chorus: refused by the group's access mode")
)

// gRPC trailer keys the server sets (see proto/chorus.proto and the Rust client).
const (
	// LeaderKey names the leader's node id on a follower's FAILED_PRECONDITION.
	LeaderKey = "chorus-leader"
	// NotStartedKey marks a refusal that did nothing with the request (the group is not
	// running on that node): even an append may then go to another node.
	NotStartedKey = "chorus-not-started"
	// AccessModeKey marks a leader's refusal of a write its group's access mode does not
	// take: no other node would take it, so it is not retried.
	AccessModeKey = "chorus-access-mode"
	// RefusedKey marks a leader's refusal of an operator's change by its strict check:
	// no other node is tried.
	RefusedKey = "chorus-refused"
)

// StatusError is an error status a node answered with (or that gRPC reported for the
// call). It matches the sentinel of its code with [errors.Is] (ErrUnauthenticated,
// ErrPermissionDenied, ...), and [status.Code] and [status.FromError] work on it.
type StatusError struct {
	// Endpoint is the endpoint that answered, as given to Dial.
	Endpoint string
	// Code is the gRPC status code.
	Code codes.Code
	// Message is the status message.
	Message string
	// Trailer holds the response trailers (LeaderKey, NotStartedKey, AccessModeKey, ...).
	Trailer metadata.MD
	// sent: the call's stream was opened on a connection (the request may have reached
	// the node).
	sent bool
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("chorus: %s: %s: %s", e.Endpoint, e.Code, e.Message)
}

// GRPCStatus lets [status.FromError] and [status.Code] see the gRPC status.
func (e *StatusError) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// Is matches the sentinel of the error's code.
func (e *StatusError) Is(target error) bool {
	switch target {
	case ErrUnauthenticated:
		return e.Code == codes.Unauthenticated
	case ErrPermissionDenied:
		return e.Code == codes.PermissionDenied
	case ErrNotFound:
		return e.Code == codes.NotFound
	case ErrOutOfRange:
		return e.Code == codes.OutOfRange
	case ErrResourceExhausted:
		return e.Code == codes.ResourceExhausted
	case ErrInvalidArgument:
		return e.Code == codes.InvalidArgument
	case ErrUnimplemented:
		return e.Code == codes.Unimplemented
	case ErrUnavailable:
		return e.Code == codes.Unavailable
	case ErrAccessMode:
		return e.Code == codes.FailedPrecondition && len(e.Trailer.Get(AccessModeKey)) > 0
	}
	return false
}

// NoLeaderError is returned when no endpoint accepted a leader-only operation within
// the leader timeout. It matches [ErrNoLeader]. Nothing was appended.
type NoLeaderError struct {
	Group  uint64
	Waited time.Duration
	// Last is the last answer seen (endpoint: message).
	Last string
}

func (e *NoLeaderError) Error() string {
	return fmt.Sprintf("chorus: no leader found for group %d within %v (last answer: %s)",
		e.Group, e.Waited.Round(time.Millisecond), e.Last)
}

// Is matches [ErrNoLeader].
func (e *NoLeaderError) Is(target error) bool { return target == ErrNoLeader }

// IndeterminateError says that a request's outcome is unknown (see [ErrIndeterminate],
// which it matches). For a record the replica appended before it stopped, LSN and CSN
// say where it would be.
type IndeterminateError struct {
	// Endpoint the request went to.
	Endpoint string
	// Detail says what happened.
	Detail string
	// Appended is true when the record was appended at LSN with CSN (the server's
	// AppendResult.unknown); false when the whole request was cut off.
	Appended bool
	LSN, CSN uint64
	// Err is the underlying error, if any (e.g. context.DeadlineExceeded).
	Err error
}

func (e *IndeterminateError) Error() string {
	if e.Appended {
		return fmt.Sprintf("chorus: %s: outcome unknown: appended at LSN %d but the replica stopped before it knew the outcome: %s",
			e.Endpoint, e.LSN, e.Detail)
	}
	return fmt.Sprintf("chorus: %s: outcome unknown, the request was cut off before its answer: %s",
		e.Endpoint, e.Detail)
}

// Is matches [ErrIndeterminate].
func (e *IndeterminateError) Is(target error) bool { return target == ErrIndeterminate }

// Unwrap returns the underlying error, if any.
func (e *IndeterminateError) Unwrap() error { return e.Err }

// BadEndpointError names an endpoint Dial could not use. It matches [ErrBadEndpoint].
type BadEndpointError struct {
	Endpoint string
	Detail   string
}

func (e *BadEndpointError) Error() string {
	return fmt.Sprintf("chorus: endpoint %q is not valid: %s (expected e.g. 127.0.0.1:7001 or https://db1:7001)",
		e.Endpoint, e.Detail)
}

// Is matches [ErrBadEndpoint].
func (e *BadEndpointError) Is(target error) bool { return target == ErrBadEndpoint }

// AppendError is what [Client.Append] returns when not every record committed. The
// per-record truth is in the outcomes Append returns beside it; this error counts them
// and wraps each distinct cause, so that errors.Is(err, ErrIndeterminate),
// errors.Is(err, ErrUnauthenticated), errors.As(err, &noLeader) and so on work on it.
type AppendError struct {
	Group                      uint64
	Committed, Failed, Unknown int
	// Errs are the distinct causes, in record order.
	Errs []error
}

func (e *AppendError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "chorus: append to group %d: %d committed, %d failed, %d unknown",
		e.Group, e.Committed, e.Failed, e.Unknown)
	for i, err := range e.Errs {
		if i == 2 {
			fmt.Fprintf(&b, "; and %d more", len(e.Errs)-2)
			break
		}
		b.WriteString("; ")
		b.WriteString(strings.TrimPrefix(err.Error(), "chorus: "))
	}
	return b.String()
}

// Unwrap returns the causes.
func (e *AppendError) Unwrap() []error { return e.Errs }
