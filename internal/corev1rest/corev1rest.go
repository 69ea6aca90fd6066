// Package corev1rest is the exporter's REST client for the few core/v1 requests it writes
// with (the Node condition, its Events, the node report). Its scheme knows core/v1 only: the
// generated typed client (k8s.io/client-go/kubernetes/typed/core/v1) would do the same
// requests, but importing it links client-go's scheme of every API group, and the exporter's
// stripped binary grows from 24 MB to 41 MB for a handful of requests.
package corev1rest

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// Client is a core/v1 REST client and the codec of its requests' options.
type Client struct {
	REST   rest.Interface
	Params runtime.ParameterCodec
}

// New returns the client for cfg (the exporter's own connection settings).
func New(cfg *rest.Config) (*Client, error) {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	if err := corev1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("registering core/v1: %w", err)
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = serializer.NewCodecFactory(s).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("building the core/v1 client for %s: %w", cfg.Host, err)
	}
	return &Client{REST: rc, Params: runtime.NewParameterCodec(s)}, nil
}

// GetNode reads the Node called name.
func (c *Client) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	n := &corev1.Node{}
	err := c.REST.Get().Resource("nodes").Name(name).Do(ctx).Into(n)
	return n, err
}
