// Package clustertest gives tests the Nodes of client-go's fake clientset as the cluster
// controller watches those of an API server.
package clustertest

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// Nodes lists and watches the Nodes of client, as cluster.Nodes does those of an API server. The
// fake clientset cannot stream lists, and says so: its informer lists and watches instead.
func Nodes(client *fake.Clientset) cache.ListerWatcher {
	nodes := client.CoreV1().Nodes()
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return nodes.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return nodes.Watch(ctx, opts)
		},
	}, client)
}
