// Command ttrpc_go is containerd's Go ttrpc as an interop peer for Interchange's tests:
// a server of the test service interchange.test.Echo, a client that runs a fixed
// scenario against any server of that service, and a unary benchmark.
//
//	ttrpc_go server -addr ADDR
//	ttrpc_go client -addr ADDR
//	ttrpc_go bench  -addr ADDR [-c N] [-conns K] [-d SECONDS] [-size BYTES]
//
// ADDR is unix:/path, tcp:host:port or host:port. It is built in GOPATH mode against
// Debian's Go sources (golang-github-containerd-ttrpc-dev 1.2.x and what it imports), so
// it uses no module proxy and no generated code of its own: the messages are protobuf's
// well-known wrapper types (BytesValue, StringValue).
package main

import (
	"fmt"
	"net"
	"os"
	"strings"
)

// Service is the full protobuf name the Echo service is registered under.
const Service = "interchange.test.Echo"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "server":
		err = serverMain(os.Args[2:])
	case "client":
		err = clientMain(os.Args[2:])
	case "bench":
		err = benchMain(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ttrpc_go %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: ttrpc_go server|client|bench -addr unix:/path|tcp:host:port ...")
	os.Exit(2)
}

// splitAddr turns unix:/path, tcp:host:port or host:port into net's network and address.
func splitAddr(addr string) (network, address string) {
	switch {
	case strings.HasPrefix(addr, "unix:"):
		return "unix", strings.TrimPrefix(addr, "unix:")
	case strings.HasPrefix(addr, "tcp:"):
		return "tcp", strings.TrimPrefix(addr, "tcp:")
	default:
		return "tcp", addr
	}
}

// dial connects to ADDR.
func dial(addr string) (net.Conn, error) {
	network, address := splitAddr(addr)
	return net.Dial(network, address)
}
