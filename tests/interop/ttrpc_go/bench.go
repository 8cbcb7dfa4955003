package main

// The unary benchmark: N goroutines calling Echo in a loop for a fixed time, spread
// over K ttrpc connections (ttrpc multiplexes calls, so one connection is the default).

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// BenchResult is the one JSON line bench prints.
type BenchResult struct {
	Calls       int     `json:"calls"`
	Seconds     float64 `json:"seconds"`
	CallsPerS   float64 `json:"calls_per_s"`
	Concurrency int     `json:"concurrency"`
	Conns       int     `json:"conns"`
	Size        int     `json:"size"`
	// Calls that failed (not counted in calls); the first failure's text.
	Errors     int     `json:"errors"`
	FirstError string  `json:"first_error"`
	P50Micros  float64 `json:"p50_us"`
	P99Micros  float64 `json:"p99_us"`
}

func benchMain(args []string) error {
	flags := flag.NewFlagSet("bench", flag.ExitOnError)
	addr := flags.String("addr", "", "unix:/path, tcp:host:port or host:port of the Echo server")
	concurrency := flags.Int("c", 1, "goroutines calling Echo")
	conns := flags.Int("conns", 1, "connections the goroutines are spread over")
	seconds := flags.Float64("d", 5, "how long to call, in seconds")
	size := flags.Int("size", 16, "Echo payload size in bytes")
	flags.Parse(args)
	if *addr == "" {
		return errors.New("-addr is required")
	}
	if *concurrency < 1 || *conns < 1 || *seconds <= 0 || *size < 0 {
		return errors.New("-c and -conns must be >= 1, -d > 0, -size >= 0")
	}

	clients := make([]*ttrpc.Client, *conns)
	for i := range clients {
		conn, err := dial(*addr)
		if err != nil {
			return err
		}
		clients[i] = ttrpc.NewClient(conn)
		defer clients[i].Close()
	}
	req := wrapperspb.Bytes(pattern(*size))

	type tally struct {
		calls, errors int
		firstError    string
		latencies     []time.Duration
	}
	tallies := make([]tally, *concurrency)
	ctx := context.Background()
	start := time.Now()
	end := start.Add(time.Duration(*seconds * float64(time.Second)))
	var wg sync.WaitGroup
	for g := 0; g < *concurrency; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			client, t := clients[g%len(clients)], &tallies[g]
			resp := &wrapperspb.BytesValue{}
			for {
				before := time.Now()
				if !before.Before(end) {
					return
				}
				if err := client.Call(ctx, Service, "Echo", req, resp); err != nil {
					if t.errors == 0 {
						t.firstError = err.Error()
					}
					t.errors++
					if errors.Is(err, ttrpc.ErrClosed) {
						return // the connection is gone: no call on it can succeed
					}
					continue
				}
				t.calls++
				t.latencies = append(t.latencies, time.Since(before))
			}
		}(g)
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()

	result := BenchResult{Seconds: elapsed, Concurrency: *concurrency, Conns: *conns, Size: *size}
	all := []time.Duration{}
	for _, t := range tallies {
		result.Calls += t.calls
		result.Errors += t.errors
		if result.FirstError == "" {
			result.FirstError = t.firstError
		}
		all = append(all, t.latencies...)
	}
	result.CallsPerS = float64(result.Calls) / elapsed
	if len(all) > 0 {
		sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
		micros := func(q float64) float64 {
			return float64(all[int(q*float64(len(all)-1))].Nanoseconds()) / 1e3
		}
		result.P50Micros, result.P99Micros = micros(0.50), micros(0.99)
	}
	return json.NewEncoder(os.Stdout).Encode(result)
}
