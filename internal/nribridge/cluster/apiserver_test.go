package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
)

// fakeAPIServer answers what an API server answers for Nodes, in JSON: the list, and a watch that
// first sends every Node when asked to (sendInitialEvents, client-go's streaming list) and then
// stays open.
func fakeAPIServer(t *testing.T, nodes ...*corev1.Node) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var requests atomic.Int32
	for _, n := range nodes {
		n.APIVersion, n.Kind, n.ResourceVersion = "v1", "Node", "1"
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.URL.Path != "/api/v1/nodes" {
			http.Error(w, "not found: "+r.URL.Path, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") != "true" {
			list := &corev1.NodeList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "NodeList"}, ListMeta: metav1.ListMeta{ResourceVersion: "1"}}
			for _, n := range nodes {
				list.Items = append(list.Items, *n)
			}
			json.NewEncoder(w).Encode(list)
			return
		}
		enc := json.NewEncoder(w)
		if r.URL.Query().Get("sendInitialEvents") == "true" {
			for _, n := range nodes {
				enc.Encode(metav1.WatchEvent{Type: "ADDED", Object: rawJSON(t, n)})
			}
			end := &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
				ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
			enc.Encode(metav1.WatchEvent{Type: "BOOKMARK", Object: rawJSON(t, end)})
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	return srv, &requests
}

func rawJSON(t *testing.T, obj any) (raw runtime.RawExtension) {
	t.Helper()
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	raw.Raw = data
	return raw
}

// The client of Nodes, with the core API group alone, decodes what an API server sends.
func TestNodesFromAnAPIServer(t *testing.T) {
	srv, requests := fakeAPIServer(t,
		node("n1", []string{"10.244.1.0/24"}, "192.0.2.1"),
		node("n2", []string{"10.244.2.0/24"}, "192.0.2.2"))
	nodes, err := Nodes(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf"}})
	if err != nil {
		t.Fatal(err)
	}
	routes := newFakeRoutes()
	ctrl, err := New(nodes, "n1", openStore(t, t.TempDir()), routes, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctrl.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	cidrs, fromAPI, err := ctrl.PodCIDRs(ctx, time.Millisecond)
	if err != nil || !fromAPI || fmt.Sprint(cidrs) != "[10.244.1.0/24]" {
		t.Fatalf("PodCIDRs from the API server: %v from the API %v (%v); %d requests", cidrs, fromAPI, err, requests.Load())
	}
	eventually(t, "routes", "10.244.2.0/24 via 192.0.2.2", routes.String)
}
