package chorus_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	chorus "github.com/chorus-log/chorus/clients/go"
)

// Dial checks its arguments without connecting.
func TestDialArguments(t *testing.T) {
	if _, err := chorus.Dial(nil); !errors.Is(err, chorus.ErrNoEndpoints) {
		t.Fatalf("no endpoints: %v", err)
	}
	c, err := chorus.Dial([]string{"127.0.0.1:7001", "http://127.0.0.1:7002", "https://db1:7003", "[::1]:7004"})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Endpoints(); len(got) != 4 || got[1] != "http://127.0.0.1:7002" {
		t.Fatalf("Endpoints() = %v", got)
	}
	c.Close()
	for _, bad := range []string{"http://no spaces:1", "ftp://h:1", "127.0.0.1", "http://h:1/path", ""} {
		_, err := chorus.Dial([]string{"127.0.0.1:7001", bad})
		var be *chorus.BadEndpointError
		if !errors.Is(err, chorus.ErrBadEndpoint) || !errors.As(err, &be) || be.Endpoint != bad {
			t.Fatalf("endpoint %q: %v", bad, err)
		}
	}
	for _, tok := range []string{"", "  ", "two words", "t\u00e9l\u00e9"} {
		if _, err := chorus.Dial([]string{"h:1"}, chorus.WithToken(tok)); !errors.Is(err, chorus.ErrBadToken) {
			t.Fatalf("token %q: %v", tok, err)
		}
	}
	if _, err := chorus.Dial([]string{"h:1"}, chorus.WithToken(" padded-token-0123456789\n")); err != nil {
		t.Fatalf("a token with surrounding white space: %v", err)
	}
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]chorus.Option{
		"missing CA":       {chorus.WithTLSCAFile(filepath.Join(dir, "nope.pem"))},
		"CA not PEM":       {chorus.WithTLSCAFile(notPEM)},
		"cert without key": {chorus.WithTLSClientCertFiles(notPEM, "")},
		"bad cert":         {chorus.WithTLSClientCertFiles(notPEM, notPEM)},
	} {
		if _, err := chorus.Dial([]string{"h:1"}, opts...); !errors.Is(err, chorus.ErrBadTLS) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}
