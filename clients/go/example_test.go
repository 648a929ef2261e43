package chorus_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	chorus "github.com/chorus-log/chorus/clients/go"
)

// Appending with explicit outcomes, then tailing the log. (It needs a running cluster,
// e.g. `chorus dev`, so it is compiled but not run by go test.)
func Example() {
	c, err := chorus.Dial([]string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	outcomes, err := c.Append(ctx, 1, [][]byte{[]byte("hello"), []byte("world")})
	for i, o := range outcomes {
		switch o.State {
		case chorus.Committed:
			fmt.Printf("record %d committed at LSN %d, CSN %d\n", i, o.LSN, o.CSN)
		case chorus.Failed:
			// Not in the log and never will be: safe to append again.
			fmt.Printf("record %d failed: %v\n", i, o.Err)
		case chorus.Unknown:
			// May be in the log: read it (at o.LSN when o.Appended) before sending
			// it again.
			fmt.Printf("record %d unknown: %v\n", i, o.Err)
		}
	}
	if errors.Is(err, chorus.ErrUnauthenticated) {
		log.Fatal("the cluster needs a token: chorus.WithToken")
	}

	// Every committed record from the start of the log, then new ones as they commit.
	for rec, err := range c.Tail(ctx, 1, 0) {
		if err != nil {
			log.Print(err) // ctx's deadline, or no node serves the group
			break
		}
		fmt.Printf("LSN %d CSN %d: %s\n", rec.LSN, rec.CSN, rec.Data)
	}
}

// A secured cluster: mutual TLS and a bearer token (here, what `chorus dev --tls
// --dir chorus-dev` generates).
func ExampleDial_tls() {
	c, err := chorus.Dial(
		[]string{"https://127.0.0.1:7001", "https://127.0.0.1:7002", "https://127.0.0.1:7003"},
		chorus.WithTLSCAFile("chorus-dev/tls/ca.pem"),
		chorus.WithTLSClientCertFiles("chorus-dev/tls/client.pem", "chorus-dev/tls/client.key"),
		chorus.WithTLSServerName("localhost"),
		chorus.WithToken("the operator token, from chorus-dev/tls/operator.token"),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for _, ns := range c.Status(context.Background(), 1) {
		if ns.Err != nil {
			fmt.Println(ns.Endpoint, ns.Err)
			continue
		}
		for _, g := range ns.Groups {
			fmt.Println(ns.Endpoint, "node", ns.Node, g.Role, "committed", g.CommittedLSN)
		}
	}
}
