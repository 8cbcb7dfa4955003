package main

// The Echo service. tests/interop/echo_service.py implements the same behaviour on
// Interchange's server, reply for reply, so that the client scenario prints the same
// lines against both: keep the two in step.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func serverMain(args []string) error {
	flags := flag.NewFlagSet("server", flag.ExitOnError)
	addr := flags.String("addr", "", "unix:/path, tcp:host:port or host:port to listen on")
	flags.Parse(args)
	if *addr == "" {
		return errors.New("-addr is required")
	}
	network, address := splitAddr(*addr)
	if network == "unix" {
		os.Remove(address) // a socket left by a killed run
	}
	listener, err := net.Listen(network, address)
	if err != nil {
		return err
	}
	server, err := ttrpc.NewServer()
	if err != nil {
		return err
	}
	server.RegisterService(Service, echoService())

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	served := make(chan error, 1)
	go func() { served <- server.Serve(context.Background(), listener) }()
	// "ready" and the address actually bound (tcp port 0 gets one from the kernel).
	fmt.Printf("ready %s:%s\n", network, listener.Addr().String())
	os.Stdout.Sync()

	select {
	case <-signals:
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := server.Shutdown(ctx); err != nil {
			server.Close()
		}
		return nil
	case err := <-served:
		return err
	}
}

func echoService() *ttrpc.ServiceDesc {
	return &ttrpc.ServiceDesc{
		Methods: map[string]ttrpc.Method{
			"Echo":     echo,
			"Fail":     fail,
			"Metadata": metadata,
			"Sleep":    sleep,
		},
		Streams: map[string]ttrpc.Stream{
			"Count": {Handler: count, StreamingServer: true},
			"Sum":   {Handler: sum, StreamingClient: true},
			"Chat":  {Handler: chat, StreamingClient: true, StreamingServer: true},
		},
	}
}

// Echo: BytesValue -> the same BytesValue.
func echo(ctx context.Context, unmarshal func(interface{}) error) (interface{}, error) {
	req := &wrapperspb.BytesValue{}
	if err := unmarshal(req); err != nil {
		return nil, err
	}
	return req, nil
}

// Fail: StringValue "CODE:message" -> that status, with one detail: Any(StringValue "detail").
func fail(ctx context.Context, unmarshal func(interface{}) error) (interface{}, error) {
	req := &wrapperspb.StringValue{}
	if err := unmarshal(req); err != nil {
		return nil, err
	}
	text, message, found := strings.Cut(req.Value, ":")
	code, err := strconv.ParseUint(text, 10, 32)
	if !found || err != nil || code == 0 {
		return nil, status.Error(codes.InvalidArgument, "fail: want CODE:message, CODE > 0")
	}
	st, err := status.New(codes.Code(code), message).WithDetails(wrapperspb.String("detail"))
	if err != nil {
		return nil, err
	}
	return nil, st.Err()
}

// Metadata: the request's metadata as sorted "key=value" lines, keys lower-cased.
func metadata(ctx context.Context, unmarshal func(interface{}) error) (interface{}, error) {
	if err := unmarshal(&wrapperspb.StringValue{}); err != nil {
		return nil, err
	}
	md, _ := ttrpc.GetMetadata(ctx)
	lines := []string{}
	for key, values := range md {
		for _, value := range values {
			lines = append(lines, strings.ToLower(key)+"="+value)
		}
	}
	sort.Strings(lines)
	return wrapperspb.String(strings.Join(lines, "\n")), nil
}

// Sleep: StringValue duration ("200ms") -> the same StringValue after that long, or
// the context's error (DEADLINE_EXCEEDED "context deadline exceeded") when it ends first.
func sleep(ctx context.Context, unmarshal func(interface{}) error) (interface{}, error) {
	req := &wrapperspb.StringValue{}
	if err := unmarshal(req); err != nil {
		return nil, err
	}
	d, err := time.ParseDuration(req.Value)
	if err != nil || d < 0 {
		return nil, status.Error(codes.InvalidArgument, "sleep: bad duration")
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return req, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Count: BytesValue "N" -> N BytesValue messages "0".."N-1". "N!" sends the N messages,
// then fails with ABORTED (an error after data, which ends the stream with a Response).
func count(ctx context.Context, stream ttrpc.StreamServer) (interface{}, error) {
	req := &wrapperspb.BytesValue{}
	if err := stream.RecvMsg(req); err != nil {
		return nil, err
	}
	text := string(req.Value)
	abort := strings.HasSuffix(text, "!")
	text = strings.TrimSuffix(text, "!")
	n, err := strconv.Atoi(text)
	if err != nil || n < 0 || text != strconv.Itoa(n) {
		return nil, status.Error(codes.InvalidArgument, "count: want a decimal count")
	}
	for i := 0; i < n; i++ {
		if err := stream.SendMsg(wrapperspb.Bytes([]byte(strconv.Itoa(i)))); err != nil {
			return nil, err
		}
	}
	if abort {
		return nil, status.Error(codes.Aborted, fmt.Sprintf("count: aborted after %d", n))
	}
	return nil, nil
}

// Sum: BytesValue messages -> one BytesValue, their values joined by ",".
func sum(ctx context.Context, stream ttrpc.StreamServer) (interface{}, error) {
	parts := [][]byte{}
	for {
		m := &wrapperspb.BytesValue{}
		if err := stream.RecvMsg(m); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		parts = append(parts, m.Value)
	}
	joined := []byte{}
	for i, part := range parts {
		if i > 0 {
			joined = append(joined, ',')
		}
		joined = append(joined, part...)
	}
	return wrapperspb.Bytes(joined), nil
}

// Chat: each BytesValue back, ASCII letters upper-cased (bytes.ToUpper would also change
// UTF-8 letters, which Python's bytes.upper does not), until the client closes; or until
// it says "bye", which ends the call from the server's side first (Data remote closed
// while the client's side is still open).
func chat(ctx context.Context, stream ttrpc.StreamServer) (interface{}, error) {
	for {
		m := &wrapperspb.BytesValue{}
		if err := stream.RecvMsg(m); err == io.EOF {
			return nil, nil
		} else if err != nil {
			return nil, err
		}
		if err := stream.SendMsg(wrapperspb.Bytes(asciiUpper(m.Value))); err != nil {
			return nil, err
		}
		if string(m.Value) == "bye" {
			return nil, nil
		}
	}
}

func asciiUpper(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		out[i] = c
	}
	return out
}
