package main

// The client scenario: every method of interchange.test.Echo, its error cases and the
// protocol's edges, one JSON line per step. The lines depend only on what the server
// replies (never on timing or map order), so the output against Go's server and against
// another implementation of the service can be compared byte for byte.

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Line is one step's outcome, printed as one JSON object.
type Line struct {
	Step    string   `json:"step"`
	OK      bool     `json:"ok"`
	Code    uint32   `json:"code"`
	Message string   `json:"message"`
	Details []string `json:"details"`
	// A string, a list of strings (streams) or null.
	Result interface{} `json:"result"`
}

// timeoutKey carries a timeout_nano to send, set apart from the context's deadline.
type timeoutKey struct{}

// withServerTimeout makes a unary call send timeout_nano = d whatever ctx's deadline is,
// so that the server's deadline, not the client's, ends the call.
func withServerTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, timeoutKey{}, d)
}

func timeoutInterceptor(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response,
	info *ttrpc.UnaryClientInfo, invoker ttrpc.Invoker) error {
	if d, ok := ctx.Value(timeoutKey{}).(time.Duration); ok {
		req.TimeoutNano = d.Nanoseconds()
	}
	return invoker(ctx, req, resp)
}

type scenario struct {
	client *ttrpc.Client
	out    *json.Encoder
}

func clientMain(args []string) error {
	flags := flag.NewFlagSet("client", flag.ExitOnError)
	addr := flags.String("addr", "", "unix:/path, tcp:host:port or host:port of the Echo server")
	flags.Parse(args)
	if *addr == "" {
		return errors.New("-addr is required")
	}
	conn, err := dial(*addr)
	if err != nil {
		return err
	}
	client := ttrpc.NewClient(conn, ttrpc.WithUnaryClientInterceptor(timeoutInterceptor))
	defer client.Close()
	out := json.NewEncoder(os.Stdout)
	out.SetEscapeHTML(false)
	s := &scenario{client: client, out: out}
	s.run()
	return nil
}

func (s *scenario) run() {
	bg := context.Background()

	// Unary Echo: text, empty (a zero-length payload both ways), binary, 1 MiB.
	s.echo("echo_text", bg, []byte("hello, ttrpc"))
	s.echo("echo_empty", bg, nil)
	s.echo("echo_binary", bg, []byte{0, 1, 2, 0xfe, 0xff, '\n', '"'})
	s.echo("echo_1mib", bg, pattern(1<<20))
	// The largest frame allowed (a Request of exactly 4 MiB), then one byte more than
	// that: the server answers RESOURCE_EXHAUSTED on that stream and keeps the connection.
	s.echo("echo_max_frame", bg, pattern(payloadForRequestSize(4<<20)))
	s.echo("echo_oversize", bg, pattern(payloadForRequestSize(4<<20+1)))
	s.echo("echo_after_oversize", bg, []byte("still here"))

	// Errors chosen by the handler: status, message and details as sent.
	for _, req := range []string{
		"5:no such thing",
		"3:bad argument",
		"13:internal trouble",
		"16:who are you",
		"7:",
		"9:caf\u00e9 \u2603 \U0001F600",
		"99:a code beyond the table",
		"nonsense",
	} {
		s.fail(req)
	}

	// Routing errors.
	s.unary("unknown_method", bg, Service, "Nope", wrapperspb.Bytes([]byte("x")), &wrapperspb.BytesValue{})
	s.unary("unknown_service", bg, "interchange.test.Nope", "Echo", wrapperspb.Bytes([]byte("x")), &wrapperspb.BytesValue{})
	s.stream("stream_unknown_method", bg, "Nope", &ttrpc.StreamDesc{StreamingServer: true}, wrapperspb.Bytes([]byte("1")), nil, false)

	// Metadata: several keys, a key with two values, one whose case was kept as sent
	// (MD literal, not Set), an empty value. Go sends the keys in map order.
	md := ttrpc.MD{
		"x-b":     {"2"},
		"x-a":     {"1"},
		"x-dup":   {"one", "two"},
		"X-Mixed": {"Case"},
		"x-empty": {""},
	}
	s.unary("metadata", ttrpc.WithMetadata(bg, md), Service, "Metadata", wrapperspb.String(""), &wrapperspb.StringValue{})
	s.unary("metadata_none", bg, Service, "Metadata", wrapperspb.String(""), &wrapperspb.StringValue{})

	// Deadlines. The Go client sends timeout_nano = time left before the ctx's deadline.
	s.unary("sleep_short", bg, Service, "Sleep", wrapperspb.String("20ms"), &wrapperspb.StringValue{})
	within, cancel := context.WithTimeout(bg, 10*time.Second)
	s.unary("sleep_within_deadline", within, Service, "Sleep", wrapperspb.String("20ms"), &wrapperspb.StringValue{})
	cancel()
	// A client deadline shorter than the sleep: the client gives up at its deadline (or
	// the server's reply comes first, which is the same code and message).
	short, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	s.unary("sleep_client_timeout", short, Service, "Sleep", wrapperspb.String("5s"), &wrapperspb.StringValue{})
	cancel()
	// Only the server's deadline (timeout_nano 100ms, the client waits 10s): the reply
	// must be the server's DEADLINE_EXCEEDED, well before the sleep would end.
	long, cancel := context.WithTimeout(bg, 10*time.Second)
	start := time.Now()
	line := s.call(withServerTimeout(long, 100*time.Millisecond), Service, "Sleep", wrapperspb.String("5s"), &wrapperspb.StringValue{})
	line.Step = "sleep_server_deadline"
	if time.Since(start) < 3*time.Second {
		line.Result = "ended by the server's deadline"
	} else {
		line.Result = "the server slept past timeout_nano"
	}
	s.print(line)
	cancel()

	// Server streaming: 0, 1 and many messages; an empty request (the handler must
	// still get it); an error before any message, and one after some.
	server := &ttrpc.StreamDesc{StreamingServer: true}
	for _, n := range []string{"0", "1", "100"} {
		s.stream("count_"+n, bg, "Count", server, wrapperspb.Bytes([]byte(n)), nil, false)
	}
	s.stream("count_empty_request", bg, "Count", server, &wrapperspb.BytesValue{}, nil, false)
	s.stream("count_bad_request", bg, "Count", server, wrapperspb.Bytes([]byte("many")), nil, false)
	s.stream("count_abort_after_3", bg, "Count", server, wrapperspb.Bytes([]byte("3!")), nil, false)

	// Client streaming: 0, 1 and several messages, an empty one among them.
	client := &ttrpc.StreamDesc{StreamingClient: true}
	s.stream("sum_0", bg, "Sum", client, nil, []string{}, false)
	s.stream("sum_1", bg, "Sum", client, nil, []string{"only"}, false)
	s.stream("sum_many", bg, "Sum", client, nil, []string{"a", "b", "", "d", "e", "f", "g", "h", "i", "j"}, false)
	// A burst: 100 messages written back to back (ttrpc has no flow control; Go 1.2.4's
	// server blocks its reader while a stream's 5-message buffer is full).
	s.stream("sum_100", bg, "Sum", client, nil, numbers(100), false)

	// Bidi: 0 messages, then ping-pong (each reply read before the next send), an empty
	// message among them.
	bidi := &ttrpc.StreamDesc{StreamingClient: true, StreamingServer: true}
	s.stream("chat_0", bg, "Chat", bidi, nil, []string{}, true)
	s.stream("chat_pingpong", bg, "Chat", bidi, nil, []string{"ping", "", "caf\u00e9", "x1y2"}, true)
	// A burst: 100 sent before any reply is read, then the close, then the replies.
	s.stream("chat_burst_100", bg, "Chat", bidi, nil, numbers(100), false)

	// Concurrency on one connection.
	s.concurrent(bg)
	s.outOfOrder(bg)
}

// print writes one line; details and the result are never null in a way that varies.
func (s *scenario) print(line Line) {
	if line.Details == nil {
		line.Details = []string{}
	}
	if err := s.out.Encode(line); err != nil {
		fmt.Fprintln(os.Stderr, "ttrpc_go client:", err)
		os.Exit(1)
	}
}

// call makes one unary call; the line has the outcome and, when OK, resp rendered.
func (s *scenario) call(ctx context.Context, service, method string, req, resp proto.Message) Line {
	err := s.client.Call(ctx, service, method, req, resp)
	line := outcome(err)
	if err == nil {
		line.Result = render(resp)
	}
	return line
}

func (s *scenario) unary(step string, ctx context.Context, service, method string, req, resp proto.Message) {
	line := s.call(ctx, service, method, req, resp)
	line.Step = step
	s.print(line)
}

func (s *scenario) echo(step string, ctx context.Context, payload []byte) {
	s.unary(step, ctx, Service, "Echo", wrapperspb.Bytes(payload), &wrapperspb.BytesValue{})
}

func (s *scenario) fail(req string) {
	step := "fail_" + strings.SplitN(req, ":", 2)[0]
	s.unary(step, context.Background(), Service, "Fail", wrapperspb.String(req), &wrapperspb.StringValue{})
}

// stream runs one streaming call: req for a server-streaming method, sends (then a
// close) for a client-streaming one; pingpong reads each reply before the next send.
// The result is the messages received, then the final one of a client-streaming call.
func (s *scenario) stream(step string, parent context.Context, method string,
	desc *ttrpc.StreamDesc, req proto.Message, sends []string, pingpong bool) {
	ctx, cancel := context.WithTimeout(parent, 10*time.Second)
	defer cancel()
	got := []string{}
	finish := func(err error) {
		line := outcome(err)
		line.Step = step
		line.Result = got
		s.print(line)
	}
	st, err := s.client.NewStream(ctx, desc, Service, method, req)
	if err != nil {
		finish(err)
		return
	}
	for _, m := range sends {
		if err := st.SendMsg(wrapperspb.Bytes([]byte(m))); err != nil {
			finish(err)
			return
		}
		if pingpong {
			reply := &wrapperspb.BytesValue{}
			if err := st.RecvMsg(reply); err != nil {
				finish(err)
				return
			}
			got = append(got, render(reply).(string))
		}
	}
	if desc.StreamingClient {
		if err := st.CloseSend(); err != nil {
			finish(err)
			return
		}
	}
	if desc.StreamingServer {
		for {
			reply := &wrapperspb.BytesValue{}
			err := st.RecvMsg(reply)
			if err == io.EOF {
				finish(nil)
				return
			} else if err != nil {
				finish(err)
				return
			}
			got = append(got, render(reply).(string))
		}
	}
	reply := &wrapperspb.BytesValue{}
	err = st.RecvMsg(reply)
	if err == nil {
		got = append(got, render(reply).(string))
	}
	finish(err)
}

// concurrent: many unary calls at once on the one connection, each its own reply.
func (s *scenario) concurrent(ctx context.Context) {
	const calls = 32
	results := make([]string, calls)
	var wg sync.WaitGroup
	for i := 0; i < calls; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			want := fmt.Sprintf("call-%02d", i)
			resp := &wrapperspb.BytesValue{}
			if err := s.client.Call(ctx, Service, "Echo", wrapperspb.Bytes([]byte(want)), resp); err != nil {
				line := outcome(err)
				results[i] = fmt.Sprintf("%s: code %d: %s", want, line.Code, line.Message)
			} else if got := string(resp.Value); got != want {
				results[i] = fmt.Sprintf("%s: got %q", want, got)
			} else {
				results[i] = "ok"
			}
		}(i)
	}
	wg.Wait()
	bad := []string{}
	for _, r := range results {
		if r != "ok" {
			bad = append(bad, r)
		}
	}
	line := Line{Step: "concurrent_unary", OK: len(bad) == 0, Result: fmt.Sprintf("%d of %d ok", calls-len(bad), calls)}
	if len(bad) > 0 {
		line.Message = strings.Join(bad, "; ")
	}
	s.print(line)
}

// outOfOrder: a slow call sent first, a quick one after it; the quick reply must come
// first (the server runs calls concurrently and replies in completion order).
func (s *scenario) outOfOrder(ctx context.Context) {
	order := make(chan string, 2)
	var wg sync.WaitGroup
	run := func(name, method string, req proto.Message, resp proto.Message) {
		defer wg.Done()
		if err := s.client.Call(ctx, Service, method, req, resp); err != nil {
			order <- name + " failed: " + outcome(err).Message
			return
		}
		order <- name
	}
	wg.Add(2)
	go run("sleep", "Sleep", wrapperspb.String("500ms"), &wrapperspb.StringValue{})
	time.Sleep(50 * time.Millisecond) // lets the slow call reach the wire first
	go run("echo", "Echo", wrapperspb.Bytes([]byte("quick")), &wrapperspb.BytesValue{})
	wg.Wait()
	close(order)
	got := []string{}
	for name := range order {
		got = append(got, name)
	}
	s.print(Line{Step: "replies_in_completion_order", OK: true, Result: got})
}

// outcome: a call's error as code, message and details. Errors of the client's own
// context become the status a server would send for them, so that which side noticed
// the deadline first does not change the line.
func outcome(err error) Line {
	if err == nil {
		return Line{OK: true}
	}
	if st, ok := status.FromError(err); ok {
		line := Line{Code: uint32(st.Code()), Message: st.Message()}
		for _, detail := range st.Proto().GetDetails() {
			line.Details = append(line.Details, renderAny(detail))
		}
		return line
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return Line{Code: uint32(codes.DeadlineExceeded), Message: err.Error()}
	case errors.Is(err, context.Canceled):
		return Line{Code: uint32(codes.Canceled), Message: err.Error()}
	}
	return Line{Code: uint32(codes.Unknown), Message: "client: " + err.Error()}
}

func renderAny(a *anypb.Any) string {
	text := &wrapperspb.StringValue{}
	if a.GetTypeUrl() == "type.googleapis.com/google.protobuf.StringValue" &&
		proto.Unmarshal(a.GetValue(), text) == nil {
		return a.GetTypeUrl() + " " + strconv.Quote(text.Value)
	}
	return fmt.Sprintf("%s hex %x", a.GetTypeUrl(), a.GetValue())
}

// render: a reply's value as text when short and printable, else hex, else (long) its
// length and digest.
func render(m proto.Message) interface{} {
	var value []byte
	switch v := m.(type) {
	case *wrapperspb.BytesValue:
		value = v.Value
	case *wrapperspb.StringValue:
		value = []byte(v.Value)
	default:
		return fmt.Sprintf("%T", m)
	}
	if len(value) > 256 {
		return fmt.Sprintf("%d bytes, sha256 %x", len(value), sha256.Sum256(value))
	}
	for _, c := range value {
		if c < 0x20 && c != '\n' || c >= 0x7f {
			return fmt.Sprintf("hex %x", value)
		}
	}
	return string(value)
}

// numbers: "0".."n-1".
func numbers(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(i)
	}
	return out
}

// pattern: n bytes that are not all alike, the same on every run.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

// payloadForRequestSize: the Echo value length whose Request is exactly size bytes
// (the frame's data length) when sent by this client without metadata or timeout.
func payloadForRequestSize(size int) int {
	n := size - 64
	for ; n < size; n++ {
		payload, _ := proto.Marshal(wrapperspb.Bytes(make([]byte, n)))
		req := &ttrpc.Request{Service: Service, Method: "Echo", Payload: payload}
		if got := proto.Size(req); got == size {
			return n
		} else if got > size {
			break
		}
	}
	panic(fmt.Sprintf("no Echo payload makes a Request of %d bytes", size))
}
