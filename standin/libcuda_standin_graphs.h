/*
 * libcuda_standin_graphs.h -- stream capture and graph launches of cudatrace's STAND-IN
 * libcuda (included by libcuda_standin.c).  NOT NVIDIA's driver: it records what a
 * capture would and "runs" nothing.
 *
 *  - cuStreamBeginCapture[_v2][_ptsz](stream): work given to that stream until
 *    cuStreamEndCapture becomes the nodes of a new graph, in order (each node a copy of the
 *    work it would have issued, with a node id from 1, 2, 3, ... per process); such a call
 *    succeeds and reports its call to the stand-in libcupti with no work (an API record,
 *    no GPU record).  The NULL stream cannot be captured (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
 *    ending a capture that was not begun is CUDA_ERROR_ILLEGAL_STATE.
 *  - cuGraphInstantiate*(exec, graph): the exec gets copies of the graph's nodes with new
 *    node ids (the next ones, in the graph's order) and a CUPTI graph id (1, 2, ... per
 *    process).
 *  - cuGraphLaunch[_ptsz](exec, stream): reported as one call whose work is every node of
 *    the exec, with its graph id and node ids (the stand-in libcupti writes a record per
 *    node, each after the one before).
 */

#define STANDIN_MAX_GRAPHS 32
#define STANDIN_MAX_NODES 64
#define STANDIN_MAX_CAPTURES 8

struct standin_graph {
    unsigned long long handle;
    uint32_t cupti_id; /* execs only */
    uint32_t count;
    struct standin_gpu_work nodes[STANDIN_MAX_NODES];
};

static pthread_mutex_t g_graph_lock = PTHREAD_MUTEX_INITIALIZER;
static struct standin_graph g_graphs[STANDIN_MAX_GRAPHS];
static int g_graph_count;
static unsigned long long g_capture_stream[STANDIN_MAX_CAPTURES];
static int g_capture_graph[STANDIN_MAX_CAPTURES];
static uint64_t g_next_node_id = 1;
static uint32_t g_next_graph_id = 1;

static struct standin_graph *graph_of(unsigned long long handle)
{
    for (int i = 0; i < g_graph_count; i++)
        if (g_graphs[i].handle == handle)
            return &g_graphs[i];
    return NULL;
}

/* The capture slot of `stream`, or -1. */
static int capture_slot(unsigned long long stream)
{
    for (int i = 0; i < STANDIN_MAX_CAPTURES; i++)
        if (stream != 0 && g_capture_stream[i] == stream)
            return i;
    return -1;
}

/* If work's stream is being captured, makes it a node of the capture's graph. */
static int captured(const struct standin_gpu_work *work)
{
    pthread_mutex_lock(&g_graph_lock);
    int slot = capture_slot(work->stream);
    int taken = 0;
    if (slot >= 0) {
        struct standin_graph *graph = &g_graphs[g_capture_graph[slot]];
        if (graph->count < STANDIN_MAX_NODES) {
            struct standin_gpu_work *node = &graph->nodes[graph->count++];
            *node = *work;
            node->graph_node_id = g_next_node_id++;
        }
        taken = 1;
    }
    pthread_mutex_unlock(&g_graph_lock);
    return taken;
}

static CUresult begin_capture(CUstream stream)
{
    if (stream == NULL)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    CUgraph handle;
    new_handle_out(&handle);
    pthread_mutex_lock(&g_graph_lock);
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    int slot = -1;
    if (capture_slot((unsigned long long)(unsigned long)stream) >= 0) {
        pthread_mutex_unlock(&g_graph_lock);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    for (int i = 0; slot < 0 && i < STANDIN_MAX_CAPTURES; i++)
        if (g_capture_stream[i] == 0)
            slot = i;
    if (slot >= 0 && g_graph_count < STANDIN_MAX_GRAPHS) {
        memset(&g_graphs[g_graph_count], 0, sizeof(g_graphs[0]));
        g_graphs[g_graph_count].handle = (unsigned long long)(unsigned long)handle;
        g_capture_stream[slot] = (unsigned long long)(unsigned long)stream;
        g_capture_graph[slot] = g_graph_count++;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_graph_lock);
    return r;
}

static CUresult end_capture(CUstream stream, CUgraph *graph)
{
    if (graph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_graph_lock);
    int slot = capture_slot((unsigned long long)(unsigned long)stream);
    CUresult r = CUDA_ERROR_ILLEGAL_STATE;
    if (slot >= 0) {
        *graph = (CUgraph)(unsigned long)g_graphs[g_capture_graph[slot]].handle;
        g_capture_stream[slot] = 0;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_graph_lock);
    return r;
}

EXPORT CUresult cuStreamBeginCapture(CUstream hStream)
{
    TOUCH();
    return begin_capture(hStream);
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, unsigned int mode)
{
    TOUCH();
    (void)mode;
    return begin_capture(hStream);
}

EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, unsigned int mode)
{
    TOUCH();
    (void)mode;
    return begin_capture(hStream);
}

EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    TOUCH();
    return end_capture(hStream, phGraph);
}

EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    TOUCH();
    return end_capture(hStream, phGraph);
}

/* The exec `exec` gets copies of `graph`'s nodes, with new node ids. */
static void instantiated(CUgraphExec exec, CUgraph graph)
{
    pthread_mutex_lock(&g_graph_lock);
    struct standin_graph *source = graph_of((unsigned long long)(unsigned long)graph);
    if (g_graph_count < STANDIN_MAX_GRAPHS) {
        struct standin_graph *copy = &g_graphs[g_graph_count++];
        memset(copy, 0, sizeof(*copy));
        copy->handle = (unsigned long long)(unsigned long)exec;
        copy->cupti_id = g_next_graph_id++;
        for (uint32_t n = 0; source != NULL && n < source->count; n++) {
            copy->nodes[n] = source->nodes[n];
            copy->nodes[n].graph_id = copy->cupti_id;
            copy->nodes[n].graph_node_id = g_next_node_id++;
        }
        copy->count = source == NULL ? 0 : source->count;
    }
    pthread_mutex_unlock(&g_graph_lock);
}

static CUresult graph_launch(uint32_t cbid, CUgraphExec exec, CUstream stream)
{
    struct standin_api_call call;
    activity_enter(cbid, &call);
    if (exec == NULL)
        return activity_exit(&call, CUDA_ERROR_INVALID_HANDLE, NULL);
    struct standin_gpu_work work;
    memset(&work, 0, sizeof(work));
    work.kind = STANDIN_WORK_GRAPH;
    work.stream = (uint64_t)(unsigned long)stream;
    pthread_mutex_lock(&g_graph_lock);
    struct standin_graph *graph = graph_of((unsigned long long)(unsigned long)exec);
    if (graph != NULL) {
        work.nodes = graph->nodes;
        work.node_count = graph->count;
    }
    pthread_mutex_unlock(&g_graph_lock);
    return activity_exit(&call, CUDA_SUCCESS, &work);
}

EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    TOUCH();
    return graph_launch(CBID_cuGraphLaunch, hGraphExec, hStream);
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    TOUCH();
    return graph_launch(CBID_cuGraphLaunch_ptsz, hGraphExec, hStream);
}
