// Command incumbent-k8s-peer is a client-go leader-election candidate on a
// coordination.k8s.io/v1 Lease (LeaseLock, ReleaseOnCancel: true). incumbent's
// Kubernetes Lease backend tests run it beside their own candidates, so both
// sides contend for one real Lease on a real kube-apiserver.
//
// stdout carries one line per event, written at once (os.Stdout is unbuffered):
//
//	elected <id>            OnStartedLeading: this process now holds the Lease
//	new-leader <identity>   OnNewLeader: the holder it observes changed (its own id too);
//	                        "new-leader" alone when it observed a released Lease (no holder)
//	stopped <id>            OnStoppedLeading, printed only if this process had been elected:
//	                        it released the Lease (SIGTERM/SIGINT) or lost it
//
// Everything else (client-go's logs, errors) goes to stderr. SIGTERM or SIGINT
// cancels the context: a leader writes the released record (holder "", lease
// duration 1s) before it exits 0. When leadership is lost without a signal it
// exits 3, or campaigns again with --rejoin.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

var (
	outMu sync.Mutex
)

func emit(format string, args ...any) {
	outMu.Lock()
	defer outMu.Unlock()
	// os.Stdout is an unbuffered *os.File: one write per line, nothing to flush.
	fmt.Fprintf(os.Stdout, format+"\n", args...)
	_ = os.Stdout.Sync() // a no-op on pipes; harmless
}

func main() {
	klog.InitFlags(nil) // -v etc.; klog writes to stderr
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "path to a kubeconfig file (default $KUBECONFIG)")
	namespace := flag.String("namespace", "default", "namespace of the Lease")
	name := flag.String("name", "", "name of the Lease (required)")
	id := flag.String("id", "", "this candidate's identity (default: hostname_pid)")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration (Go duration, at least 1s; written to the Lease in whole seconds)")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline; must be < lease-duration")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod; 1.2 x retry-period must be < renew-deadline")
	rejoin := flag.Bool("rejoin", false, "campaign again after losing leadership instead of exiting 3")
	flag.Parse()

	if *name == "" {
		fmt.Fprintln(os.Stderr, "incumbent-k8s-peer: --name is required")
		os.Exit(2)
	}
	if *leaseDuration < time.Second {
		// client-go writes spec.leaseDurationSeconds = lease-duration truncated to whole
		// seconds, and the API server refuses 0.
		fmt.Fprintln(os.Stderr, "incumbent-k8s-peer: --lease-duration must be at least 1s")
		os.Exit(2)
	}
	if *id == "" {
		host, _ := os.Hostname()
		*id = fmt.Sprintf("%s_%d", host, os.Getpid())
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "incumbent-k8s-peer: kubeconfig: %v\n", err)
		os.Exit(2)
	}
	cfg.QPS = 100
	cfg.Burst = 200
	cfg.UserAgent = "incumbent-k8s-peer"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "incumbent-k8s-peer: client: %v\n", err)
		os.Exit(2)
	}

	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: *namespace, Name: *name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: *id},
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		cancel()
	}()

	for {
		var mu sync.Mutex
		leading := false
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   *leaseDuration,
			RenewDeadline:   *renewDeadline,
			RetryPeriod:     *retryPeriod,
			ReleaseOnCancel: true,
			Name:            *name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {
					mu.Lock()
					leading = true
					mu.Unlock()
					emit("elected %s", *id)
				},
				OnStoppedLeading: func() {
					// client-go calls this whenever Run returns, led or not.
					mu.Lock()
					was := leading
					leading = false
					mu.Unlock()
					if was {
						emit("stopped %s", *id)
					}
				},
				OnNewLeader: func(identity string) {
					if identity == "" {
						emit("new-leader")
					} else {
						emit("new-leader %s", identity)
					}
				},
			},
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "incumbent-k8s-peer: %v\n", err)
			os.Exit(2)
		}
		le.Run(ctx) // returns after release (ctx cancelled) or on lost leadership
		if ctx.Err() != nil {
			os.Exit(0)
		}
		if !*rejoin {
			os.Exit(3)
		}
	}
}
