package cluster

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Nodes returns how the controller lists and watches the Nodes of the API server of config: with
// a client of the core API group alone. client-go's clientset would link every API group's types
// into nri-bridge (some 20 MB) for this one resource.
func Nodes(config *rest.Config) (cache.ListerWatcher, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	core := rest.CopyConfig(config)
	core.APIPath = "/api"
	core.GroupVersion = &corev1.SchemeGroupVersion
	core.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	client, err := rest.RESTClientFor(core)
	if err != nil {
		return nil, err
	}
	return cache.NewListWatchFromClient(client, "nodes", metav1.NamespaceAll, fields.Everything()), nil
}
