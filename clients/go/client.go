package chorus

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/chorus-log/chorus/clients/go/chorusv1"
)

// Defaults of the client's timeouts (the Rust client's).
const (
	// DefaultLeaderTimeout is how long a leader-only operation keeps looking for a
	// leader (elections included) before it fails with ErrNoLeader.
	DefaultLeaderTimeout = 10 * time.Second
	// DefaultCallTimeout is how long one call waits for its answer before it is cut off
	// (an append then ends indeterminate): longer than any commit a live cluster takes.
	DefaultCallTimeout = 30 * time.Second
)

// HTTP/2 PING interval on every connection, idle or not, and how long a PING may go
// unanswered before the connection is closed, so a dead peer that never closed its side
// is noticed.
const (
	keepaliveInterval = 10 * time.Second
	keepaliveTimeout  = 10 * time.Second
	connectTimeout    = 2 * time.Second
	maxMessageBytes   = 64 << 20
	retryPause        = 50 * time.Millisecond
)

// Client talks to a Chorus cluster given the API endpoints of its nodes. Leader-only
// operations (Append) find the group's leader by trying endpoints (a follower answers
// FAILED_PRECONDITION, naming the leader when it knows it) and remember it; reads go to
// the remembered leader first, then to any node that answers.
//
// A Client is safe for concurrent use by many goroutines. Connections open lazily, on
// the first call to each endpoint; Close closes them.
type Client struct {
	endpoints []string
	conns     []*grpc.ClientConn
	stubs     []chorusv1.ChorusClient
	cfg       config

	mu     sync.Mutex
	leader map[uint64]int // group -> endpoint index of its last known leader
	nodes  map[uint64]int // node id -> endpoint index, learned from Status
}

type config struct {
	caFile, certFile, keyFile string
	serverName                string
	tlsConfig                 *tls.Config
	token                     string
	hasToken                  bool
	leaderTimeout             time.Duration
	callTimeout               time.Duration
	dialOptions               []grpc.DialOption
}

// Option configures Dial.
type Option func(*config)

// WithTLSCAFile makes connections TLS, checking the nodes' API certificates against the
// CA certificate(s) in this PEM file (a node's `[api_tls]`). With TLS, an endpoint
// written host:port or http://host:port is dialled as https.
func WithTLSCAFile(path string) Option { return func(c *config) { c.caFile = path } }

// WithTLSClientCertFiles presents this certificate chain and private key (PEM files) to
// nodes that require client certificates (mutual TLS, `api_tls.client_ca`). Both are
// needed; it implies TLS.
func WithTLSClientCertFiles(certFile, keyFile string) Option {
	return func(c *config) { c.certFile, c.keyFile = certFile, keyFile }
}

// WithTLSServerName checks this name in the nodes' certificates instead of the
// endpoint's host (e.g. "localhost" for a `chorus dev --tls` cluster reached at
// 127.0.0.1). It implies TLS.
func WithTLSServerName(name string) Option { return func(c *config) { c.serverName = name } }

// WithTLSConfig uses this TLS configuration as it is (a copy is taken); the other TLS
// options, when also given, fill in its RootCAs, Certificates and ServerName.
func WithTLSConfig(cfg *tls.Config) Option {
	return func(c *config) { c.tlsConfig = cfg.Clone() }
}

// WithToken sends `authorization: Bearer <token>` on every call (a node's
// `[api_auth]`); surrounding white space is trimmed. Without TLS the token travels in
// clear text.
func WithToken(token string) Option {
	return func(c *config) { c.token, c.hasToken = strings.TrimSpace(token), true }
}

// WithLeaderTimeout sets how long a leader-only operation keeps looking for a leader
// (DefaultLeaderTimeout).
func WithLeaderTimeout(d time.Duration) Option { return func(c *config) { c.leaderTimeout = d } }

// WithCallTimeout sets how long one unary call waits for its answer before it is cut
// off (DefaultCallTimeout): an append then ends indeterminate. Without a bound, a call
// whose answer is lost (a server that stops answering without closing its connection)
// would wait for the caller's context alone.
func WithCallTimeout(d time.Duration) Option { return func(c *config) { c.callTimeout = d } }

// WithDialOptions adds gRPC dial options (interceptors, a custom dialer, ...), applied
// after the client's own.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *config) { c.dialOptions = append(c.dialOptions, opts...) }
}

func (c *config) wantsTLS() bool {
	return c.caFile != "" || c.certFile != "" || c.keyFile != "" || c.serverName != "" || c.tlsConfig != nil
}

// buildTLS loads the TLS files into a tls.Config.
func (c *config) buildTLS() (*tls.Config, error) {
	t := c.tlsConfig
	if t == nil {
		t = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: CA file: %v", ErrBadTLS, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: CA file %q holds no PEM certificate", ErrBadTLS, c.caFile)
		}
		t.RootCAs = pool
	}
	switch {
	case c.certFile != "" && c.keyFile != "":
		pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: client certificate %q and key %q: %v", ErrBadTLS, c.certFile, c.keyFile, err)
		}
		t.Certificates = []tls.Certificate{pair}
	case c.certFile != "" || c.keyFile != "":
		return nil, fmt.Errorf("%w: a client certificate needs its key and a key its certificate", ErrBadTLS)
	}
	if c.serverName != "" {
		t.ServerName = c.serverName
	}
	return t, nil
}

// bearer is the token as per-call credentials.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false: as with the Rust client, a token may be sent over
// plain text (to a node on loopback, or behind a proxy that terminates TLS).
func (bearer) RequireTransportSecurity() bool { return false }

// Dial returns a client for these endpoints: host:port, http://host:port or
// https://host:port. No connection is made yet (they open on first use), so Dial fails
// only on bad arguments: no endpoints, a malformed endpoint, unreadable TLS files or a
// bad token.
//
// Connections are plain text unless a TLS option is given or the endpoint says https;
// with TLS every endpoint is dialled with TLS (http:// is upgraded, as the Rust client
// does, since a node serving TLS refuses plain text anyway).
func Dial(endpoints []string, opts ...Option) (*Client, error) {
	cfg := config{leaderTimeout: DefaultLeaderTimeout, callTimeout: DefaultCallTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	if len(endpoints) == 0 {
		return nil, ErrNoEndpoints
	}
	if cfg.hasToken {
		if cfg.token == "" {
			return nil, ErrBadToken
		}
		for i := 0; i < len(cfg.token); i++ {
			if b := cfg.token[i]; b <= ' ' || b > '~' {
				return nil, ErrBadToken
			}
		}
	}
	var tlsCfg *tls.Config
	if cfg.wantsTLS() {
		var err error
		if tlsCfg, err = cfg.buildTLS(); err != nil {
			return nil, err
		}
	}
	c := &Client{
		cfg:    cfg,
		leader: map[uint64]int{},
		nodes:  map[uint64]int{},
	}
	for _, ep := range endpoints {
		hostport, secure, err := parseEndpoint(ep, tlsCfg != nil)
		if err != nil {
			c.Close()
			return nil, err
		}
		var creds credentials.TransportCredentials
		switch {
		case tlsCfg != nil:
			creds = credentials.NewTLS(tlsCfg)
		case secure:
			creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
		default:
			creds = insecure.NewCredentials()
		}
		dopts := []grpc.DialOption{
			grpc.WithTransportCredentials(creds),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{
				Time:                keepaliveInterval,
				Timeout:             keepaliveTimeout,
				PermitWithoutStream: true,
			}),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff: backoff.Config{
					BaseDelay:  100 * time.Millisecond,
					Multiplier: 1.6,
					Jitter:     0.2,
					MaxDelay:   2 * time.Second,
				},
				MinConnectTimeout: connectTimeout,
			}),
			grpc.WithDefaultCallOptions(
				grpc.MaxCallRecvMsgSize(maxMessageBytes),
				grpc.MaxCallSendMsgSize(maxMessageBytes),
			),
		}
		if cfg.hasToken {
			dopts = append(dopts, grpc.WithPerRPCCredentials(bearer(cfg.token)))
		}
		dopts = append(dopts, cfg.dialOptions...)
		conn, err := grpc.NewClient("dns:///"+hostport, dopts...)
		if err != nil {
			c.Close()
			return nil, &BadEndpointError{Endpoint: ep, Detail: err.Error()}
		}
		c.endpoints = append(c.endpoints, ep)
		c.conns = append(c.conns, conn)
		c.stubs = append(c.stubs, chorusv1.NewChorusClient(conn))
	}
	return c, nil
}

// parseEndpoint splits an endpoint into host:port and whether it asks for TLS.
func parseEndpoint(ep string, tlsOn bool) (hostport string, secure bool, err error) {
	rest := ep
	secure = tlsOn
	if scheme, r, ok := strings.Cut(ep, "://"); ok {
		switch scheme {
		case "http":
		case "https":
			secure = true
		default:
			return "", false, &BadEndpointError{Endpoint: ep, Detail: fmt.Sprintf("unknown scheme %q (http or https)", scheme)}
		}
		rest = strings.TrimSuffix(r, "/")
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || host == "" || port == "" || strings.ContainsAny(rest, " /?#@") {
		detail := "not host:port"
		if err != nil {
			detail = err.Error()
		}
		return "", false, &BadEndpointError{Endpoint: ep, Detail: detail}
	}
	return rest, secure, nil
}

// Endpoints returns the endpoints, as given to Dial.
func (c *Client) Endpoints() []string { return append([]string(nil), c.endpoints...) }

// Stub returns the generated gRPC client for endpoint i, sharing this client's
// connection, TLS and token: for the operations this package does not wrap
// (membership, leader transfer, out-of-order groups, ...).
func (c *Client) Stub(i int) chorusv1.ChorusClient { return c.stubs[i] }

// KnownLeader returns the endpoint of the group's leader as last learned by a
// leader-only operation, if any.
func (c *Client) KnownLeader(group uint64) (endpoint string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.leader[group]
	if !ok {
		return "", false
	}
	return c.endpoints[i], true
}

// Close closes every connection; calls in flight fail.
func (c *Client) Close() error {
	var first error
	for _, conn := range c.conns {
		if err := conn.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (c *Client) setLeader(group uint64, i int) {
	c.mu.Lock()
	c.leader[group] = i
	c.mu.Unlock()
}

func (c *Client) learnNode(node uint64, i int) {
	c.mu.Lock()
	c.nodes[node] = i
	c.mu.Unlock()
}

// leaderIndex is the endpoint to try first for the group: its last known leader, or 0.
func (c *Client) leaderIndex(group uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader[group]
}

// nodeIndex is the endpoint of node id n, if learned.
func (c *Client) nodeIndex(n uint64) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.nodes[n]
	return i, ok
}

// callCtx bounds one unary call by the call timeout.
func (c *Client) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.cfg.callTimeout > 0 {
		return context.WithTimeout(ctx, c.cfg.callTimeout)
	}
	return context.WithCancel(ctx)
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
