// Package chorus is the Go client of Chorus, a replicated write-ahead log.
//
// It wraps the gRPC API of proto/chorus.proto (generated into the chorusv1 package)
// with what the Rust client (crates/chorus-client) does: it finds each group's leader
// among the endpoints and remembers it, retries a request on another node only when
// the answer proves the request did nothing, and never retries an append whose outcome
// is unknown.
//
//	c, err := chorus.Dial([]string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"})
//	if err != nil { ... }
//	defer c.Close()
//	outcomes, err := c.Append(ctx, 1, [][]byte{[]byte("hello"), []byte("world")})
//	for i, o := range outcomes {
//		switch o.State {
//		case chorus.Committed: // in the log at o.LSN with o.CSN
//		case chorus.Failed:    // not in the log, never will be: may be sent again
//		case chorus.Unknown:   // may be in the log: read it to find out, never resend blindly
//		}
//	}
//
// # Outcomes and retries
//
// Every appended record gets an explicit Outcome: Committed (with LSN and CSN), Failed
// (with why; it is not in the log and never will be, so sending it again cannot
// duplicate it), or Unknown (it may be in the log). See [Client.Append] for exactly
// which answers lead to which.
//
// # Security
//
// A node may serve TLS (`[api_tls]`, optionally requiring client certificates) and
// require a bearer token (`[api_auth]`): see [WithTLSCAFile], [WithTLSClientCertFiles],
// [WithTLSServerName] and [WithToken]. A missing or unknown token fails with
// [ErrUnauthenticated], an identity not allowed the operation with
// [ErrPermissionDenied].
//
// # Errors
//
// Errors match the sentinels of this package with [errors.Is] ([ErrNoLeader],
// [ErrIndeterminate], [ErrUnauthenticated], ...), and the concrete types
// ([*StatusError], [*NoLeaderError], [*IndeterminateError], [*AppendError]) can be
// taken out with [errors.As].
package chorus
