"""Which aten ops the C7x quantizer annotates, and the graph tests behind its rules.

The op tables follow the reference annotation table (docs/reference.md, "Quantizer rules");
ops marked *ours* cover what torchvision CNNs produce that the table misses,
so that the int8/int16 chain between MMALIB layers stays unbroken.

Per kind: the ops, what is observed on the inputs, and the output.

* WEIGHTED -- conv2d, linear: input act; weight per-channel (axis 0); bias
  left float. Output act, or not observed when fused (below).
* BINARY -- mm, add.Tensor, add_.Tensor: both args act, only if both are
  float-tensor Nodes (``x + 1.0`` stays float). Output act (add: or fused).
  An add.Tensor / add_.Tensor that reaches ``topk`` stays float (detection rule).
* ADDMM -- addmm: args[1] and args[2] per-tensor act (the reference's choice,
  the weight operand too); bias args[0] float. Output act.
* INDEPENDENT -- gelu, silu, hardsigmoid, hardswish, adaptive_avg_pool2d,
  avg_pool2d; *ours*: gelu_, silu_, hardsigmoid_, hardswish_ (torchvision's
  ``inplace=True`` modules), mean.dim (global average pool) and tanh, tanh_. Input act,
  output an independent act (the op changes the value range).
* LAYER_NORM -- layer_norm: input act, weight/bias float. Output act.
* TRANSPARENT -- relu, relu_, max_pool2d, view, permute, flatten.using_ints;
  *ours*: hardtanh, hardtanh_, relu6 (ReLU6), reshape, dropout, dropout_
  (identity in eval), roll (Swin's cyclic shift), select (ViT's class token). After a softmax (fixed qparams) the
  input and output share the softmax's observer. Input act; the output shares the input node's
  observer (SharedQuantizationSpec) when that output is observed, else an
  independent act. *Ours*: when the input is itself a view (:data:`VIEW_OPS`)
  of an observed tensor, input and output share that tensor's observer
  (nn.MultiheadAttention's select / view of its fused projection: no
  requantize between views). Not annotated when it reaches ``topk`` (detection rule).
* SE_GATE (*ours*, an extension) -- sigmoid / sigmoid_ that is a
  squeeze-excitation gate (:func:`is_se_gate`: its [N, C, 1, 1] output only
  feeds mul.Tensor / mul_.Tensor with an [N, C, H, W] float tensor, and it does
  not reach ``topk``). Input act, output an independent act: the gate is then
  an int8/int16 tensor and the multiply runs on integers (the reference leaves
  sigmoid float). Graphs without such a gate (MobileNetV2, ResNet, the
  detection heads) are annotated exactly as before.
* SOFTMAX (*ours*, an extension) -- softmax.int / _softmax over the last
  axis of a float tensor, in an int8 node, not reaching ``topk``: input act (the
  attention logits), output the fixed int8 qparams scale 1/256, zero point -128
  (:func:`pipeline.quant.specs.softmax_output_spec`; the ``c7x_int8_softmax``
  kernel's output, docs/reference.md, "Softmax"). int16 nodes keep a float softmax
  (no int16 kernel). The reference leaves softmax float.
* MATMUL (*ours*, an extension) -- matmul / bmm of two activations
  (:func:`is_activation_matmul`: neither operand is a weight): attention's Q.K^T and
  attention.V. Each input shares the observer of the node it is a view of
  (:func:`view_source`: through transpose, permute, view, reshape, expand, split /
  chunk and getitem), else gets its own act, so that the ``mmalib_batch_matmul``
  kernel reads the producer's int8/int16 tensor through strides. Output act; when
  its only users are a chain of multiplies by Python scalars (attention's ``*
  scale``), the last of them carries the output observer instead (the kernel folds
  the factor into its rescale). Before annotating, :func:`hoist_scalar_multiplies`
  moves a scalar multiply on an operand (``(q * scale) @ k``) behind the matmul.
  The reference leaves these matmuls float.
* Not annotated: cat (deliberately), group_norm, any other sigmoid, mul
  (its SE operands are quantized by their producers), anything else.

Float-tensor gating (``meta["val"]`` is a floating-point tensor) applies to
every kind except WEIGHTED and ADDMM.

Shapes and dtypes: activations are float32 tensors of any rank (NCHW for the
conv/pool ops, [M, K] for mm/addmm, [..., K] for linear); conv weights are
OIHW and linear weights [out, in], so output channels are axis 0.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

aten = torch.ops.aten

WEIGHTED = frozenset({aten.conv2d.default, aten.linear.default})
BINARY = frozenset({aten.mm.default, aten.add.Tensor, aten.add_.Tensor})
ADDMM = frozenset({aten.addmm.default})
INDEPENDENT = frozenset({
    aten.gelu.default, aten.silu.default, aten.hardsigmoid.default, aten.hardswish.default,
    aten.adaptive_avg_pool2d.default, aten.avg_pool2d.default,
    # ours: inplace variants from torchvision modules (inplace=True), mean.dim (GAP) and tanh
    # (MaxViT's classifier; an int8 table lookup like the others)
    aten.gelu_.default, aten.silu_.default, aten.hardsigmoid_.default, aten.hardswish_.default,
    aten.mean.dim, aten.tanh.default, aten.tanh_.default,
})
LAYER_NORM = frozenset({aten.layer_norm.default})
#: the average pools of INDEPENDENT: in mixed precision they take an int16 producer's dtype
#: (the int16 pool kernels need one dtype in and out; docs/reference.md, "Quantizer rules")
AVERAGE_POOLS = frozenset({aten.adaptive_avg_pool2d.default, aten.avg_pool2d.default, aten.mean.dim})
TRANSPARENT = frozenset({
    aten.relu.default, aten.relu_.default, aten.max_pool2d.default, aten.view.default,
    aten.permute.default, aten.flatten.using_ints,
    # ours: ReLU6 (hardtanh_ in torchvision MobileNetV2, relu6 from F.relu6), reshape,
    # eval-mode dropout (an identity)
    aten.hardtanh.default, aten.hardtanh_.default, aten.relu6.default,
    aten.reshape.default, aten.dropout.default, aten.dropout_.default,
    # ours: Swin's cyclic shift and ViT's class-token select, data movement (int8 takes,
    # docs/reference.md, "Take")
    aten.roll.default, aten.select.int,
})

#: producers whose output is not observed when a fusable activation is their only user.
FUSABLE_PRODUCERS = frozenset({aten.conv2d.default, aten.linear.default,
                               aten.add.Tensor, aten.add_.Tensor})
#: activations the C7x kernels apply after the accumulator (relu / clip;
#: docs/reference.md, "Kernel math").
FUSABLE_ACTIVATIONS = frozenset({aten.relu.default, aten.relu_.default, aten.hardtanh.default,
                                 aten.hardtanh_.default, aten.relu6.default})

#: ours: a squeeze-excitation gate (see :func:`is_se_gate`).
SE_GATE = frozenset({aten.sigmoid.default, aten.sigmoid_.default})
SE_MULTIPLY = frozenset({aten.mul.Tensor, aten.mul_.Tensor})

#: ours: softmax over the last axis (see :func:`is_last_axis_softmax`)
SOFTMAX = frozenset({aten.softmax.int, aten._softmax.default})

#: ours: activation x activation matmuls (see :func:`is_activation_matmul`)
MATMUL = frozenset({aten.matmul.default, aten.bmm.default})
#: ops that only re-index their first argument (a view of it): an activation matmul's operand
#: may reach its producer through them (:func:`view_source`)
VIEW_OPS = frozenset({aten.transpose.int, aten.permute.default, aten.view.default, aten.reshape.default,
                      aten.expand.default, aten.split.Tensor, aten.split_with_sizes.default,
                      aten.chunk.default, aten.t.default, operator.getitem, aten.select.int,
                      aten.unflatten.int, aten.unsqueeze.default, aten.squeeze.dim, aten.contiguous.default,
                      aten.clone.default, aten.flatten.using_ints})
#: torch's fused attention (nn.MultiheadAttention, ViT): decomposed before annotation
SDPA = frozenset({aten.scaled_dot_product_attention.default})
#: padding ops: one of zero width is dropped before annotation (:func:`drop_empty_pads`)
PAD = frozenset({aten.pad.default, aten.constant_pad_nd.default})
#: einsum of two operands (MaxViT's attention): rewritten as a batched matmul before annotation
EINSUM = frozenset({aten.einsum.default})
SCALAR_MULTIPLY = frozenset({aten.mul.Tensor})

TOPK = frozenset({aten.topk.default})
#: ops a detection score may pass through on its way to topk and still count as
#: "reaching topk" (docs/reference.md, "Quantizer rules": detection-head rule).
#: *Ours* beyond the reference's list: the element-wise and data-movement ops of
#: an NMS-free head's box decode, which joins the scores before the ranking
#: (YOLO26: ``anchors +/- distances`` (add/sub), ``* strides`` (mul), sigmoid,
#: cat of boxes and scores, then permute/split/max/topk/gather). Without them
#: the ``anchors + distance`` add is quantized like a residual add and the box
#: corners of the [1, 300, 6] output lose up to half an int8 step of the whole
#: coordinate range. Conv/linear/mm are not in the path, so the backbone is
#: never reached.
RANKING_PATH = TRANSPARENT | {operator.getitem, aten.split.Tensor, aten.split_with_sizes.default,
                              aten.max.dim, aten.min.dim,
                              # ours: the box decode and the gather of an NMS-free head
                              aten.cat.default, aten.chunk.default, aten.sigmoid.default,
                              aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor,
                              aten.unsqueeze.default, aten.expand.default, aten.gather.default,
                              aten.transpose.int}


def is_float_tensor(arg) -> bool:
    """True if ``arg`` is an fx Node whose ``meta["val"]`` is a floating-point tensor
    (the float-tensor gating of docs/reference.md, "Quantizer rules"; a Node without
    ``val`` does not pass)."""
    if not isinstance(arg, Node):
        return False
    val = arg.meta.get("val")
    return isinstance(val, torch.Tensor) and val.is_floating_point()


def reaches_topk(node: Node) -> bool:
    """True if ``node``'s output reaches a ``topk`` through RANKING_PATH ops only
    (transparent, getitem/split, max.dim/min.dim). Such transparent ops stay
    unannotated, which keeps detection ranking in float (docs/reference.md,
    "Quantizer rules")."""
    stack, seen = list(node.users), set()
    while stack:
        user = stack.pop()
        if user in seen or user.op != "call_function":
            continue
        seen.add(user)
        if user.target in TOPK:
            return True
        if user.target in RANKING_PATH:
            stack.extend(user.users)
    return False


def _shape(node) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def is_se_multiply(node: Node) -> bool:
    """``node`` is a squeeze-excitation multiply: mul.Tensor / mul_.Tensor of two float
    tensors, one [N, C, H, W] and the other [N, C, 1, 1] (either order)."""
    if node.op != "call_function" or node.target not in SE_MULTIPLY or len(node.args) != 2:
        return False
    a, b = node.args
    if not (is_float_tensor(a) and is_float_tensor(b)):
        return False
    sa, sb = _shape(a), _shape(b)
    for x, g in ((sa, sb), (sb, sa)):
        if len(x) == 4 and len(g) == 4 and g[:2] == x[:2] and g[2:] == (1, 1) and x[2:] != (1, 1):
            return True
    return False


def is_se_gate(node: Node) -> bool:
    """``node`` (a sigmoid) is a squeeze-excitation gate: a float [N, C, 1, 1] output
    whose users are all :func:`is_se_multiply` nodes, and not on a ranking path."""
    shape = _shape(node)
    users = list(node.users)
    return (shape is not None and len(shape) == 4 and shape[2:] == (1, 1) and bool(users)
            and all(is_se_multiply(u) for u in users) and not reaches_topk(node))


def is_last_axis_softmax(node: Node) -> bool:
    """``node`` (softmax.int / _softmax) normalises the last axis of its float input."""
    shape = _shape(node.args[0]) if node.args else None
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    return shape is not None and isinstance(dim, int) and len(shape) > 0 and dim % len(shape) == len(shape) - 1


def view_source(node: Node) -> Node:
    """The first node up ``node``'s chain of :data:`VIEW_OPS` (first arguments) that is not
    one: the tensor ``node`` is a view of (``node`` itself when it is no view op)."""
    while node.op == "call_function" and node.target in VIEW_OPS and isinstance(node.args[0], Node):
        node = node.args[0]
    return node


def scalar_factor(node: Node) -> float | None:
    """The Python number ``c`` of ``node`` = ``mul.Tensor(x, c)`` (or ``(c, x)``), else None."""
    if node.op != "call_function" or node.target not in SCALAR_MULTIPLY or len(node.args) != 2:
        return None
    numbers = [a for a in node.args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    return float(numbers[0]) if len(numbers) == 1 else None


def is_activation_matmul(node: Node) -> bool:
    """``node`` is a matmul / bmm of two float activations of rank >= 2: neither operand is a
    view of a parameter (``get_attr``), which a linear layer's weight would be."""
    if node.op != "call_function" or node.target not in MATMUL or len(node.args) != 2:
        return False
    return all(is_float_tensor(a) and len(_shape(a) or ()) >= 2 and view_source(a).op != "get_attr"
               for a in node.args)


def read_by_activation_matmul(node: Node) -> bool:
    """An activation matmul (:func:`is_activation_matmul`) not reaching ``topk`` reads ``node``'s
    output, directly or through :data:`VIEW_OPS` views of it."""
    for user in node.users:
        if user.op != "call_function":
            continue
        if user.target in MATMUL and is_activation_matmul(user) and not reaches_topk(user):
            return True
        if user.target in VIEW_OPS and user.args[0] is node and read_by_activation_matmul(user):
            return True
    return False


def _scalar_multiply_on(operand: Node) -> Node | None:
    """The scalar multiply at the top of ``operand``'s single-user view chain, if any."""
    node = operand
    while len(node.users) == 1:
        if scalar_factor(node) is not None:
            return node
        if not (node.op == "call_function" and node.target in VIEW_OPS and isinstance(node.args[0], Node)):
            return None
        node = node.args[0]
    return None


def hoist_scalar_multiplies(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite ``matmul(view(x * c), b)`` as ``matmul(view(x), b) * c`` (either operand, every
    activation matmul of ``gm``; in place, also returned). Exact in real arithmetic, within float32
    rounding in torch; the quantized program is built from the rewritten graph, so the deployed
    kernel and the Q/DQ reference agree on it. Attention scales its queries this way
    (``(q * scale) @ k``, YOLO26's C2PSA, Swin); with the factor behind the matmul the operand is a
    plain view of the producer and the factor joins the kernel's rescale."""
    changed = False
    for node in list(gm.graph.nodes):
        if not is_activation_matmul(node):
            continue
        for operand in node.args:
            mul = _scalar_multiply_on(operand)
            if mul is None:
                continue
            x = next(a for a in mul.args if isinstance(a, Node))
            factor = scalar_factor(mul)
            mul.replace_all_uses_with(x)
            gm.graph.erase_node(mul)
            with gm.graph.inserting_after(node):
                moved = gm.graph.call_function(aten.mul.Tensor, (node, factor))
            node.replace_all_uses_with(moved, delete_user_cb=lambda user, moved=moved: user is not moved)
            # the moved multiply is not the old one (another shape): no numeric-debugger identity
            moved.meta.update(_meta_without_identity(mul.meta))
            moved.meta["val"] = node.meta.get("val")
            changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm


def _meta_without_identity(meta: dict) -> dict:
    """``meta`` without the value, and without what torchao's numeric debugger matches nodes by
    (``from_node``, ``custom["numeric_debug_handle"]``): for a node that computes something else
    than the node it was made from (its layer provenance stays)."""
    out = {k: v for k, v in meta.items() if k not in ("val", "tensor_meta", "from_node")}
    if "custom" in out:
        out["custom"] = {k: v for k, v in out["custom"].items() if k != "numeric_debug_handle"}
    return out


def _fake_value(model_val, fn):
    """``fn()`` under the fake mode of ``model_val`` (a node's ``meta["val"]``), for new nodes' meta."""
    from torch._guards import detect_fake_mode
    mode = detect_fake_mode([model_val])
    if mode is None:
        return fn()
    with mode:
        return fn()


def _plain_attention(node: Node) -> tuple[Node, Node, Node, float] | None:
    """``(q, k, v, scale)`` of an ``scaled_dot_product_attention`` without mask, dropout, causal
    mask or grouped heads (inference attention), else None. ``scale`` defaults to 1/sqrt(E)."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    bound = dict(zip(names, node.args)) | dict(node.kwargs)
    if (bound.get("attn_mask") is not None or bound.get("dropout_p", 0.0) != 0.0 or bound.get("is_causal", False)
            or bound.get("enable_gqa", False)):
        return None
    q, k, v = bound["query"], bound["key"], bound["value"]
    shape = _shape(q)
    if not all(is_float_tensor(a) for a in (q, k, v)) or not shape:
        return None
    scale = bound.get("scale")
    return q, k, v, float(scale) if scale is not None else shape[-1] ** -0.5


def decompose_attention(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite each plain ``scaled_dot_product_attention(q, k, v)`` (:func:`_plain_attention`) as
    ``softmax((q @ k^T) * scale, -1) @ v``, torch's own math path (in place, also returned), so
    the quantizer sees the two matmuls and the softmax (rules MATMUL, SOFTMAX). Equal to torch's
    fused kernel within float32 rounding; the Q/DQ model is built from the rewritten graph."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in SDPA:
            continue
        plain = _plain_attention(node)
        if plain is None:
            continue
        q, k, v, scale = plain
        g = gm.graph
        qv, kv, vv = (a.meta["val"] for a in (q, k, v))
        with g.inserting_before(node):
            kt = g.call_function(aten.transpose.int, (k, -2, -1))
            kt.meta["val"] = _fake_value(kv, lambda: kv.transpose(-2, -1))
            scores = g.call_function(aten.matmul.default, (q, kt))
            scores.meta["val"] = _fake_value(qv, lambda: torch.matmul(qv, kt.meta["val"]))
            scaled = g.call_function(aten.mul.Tensor, (scores, scale))
            scaled.meta["val"] = scores.meta["val"]
            probs = g.call_function(aten.softmax.int, (scaled, -1))
            probs.meta["val"] = scores.meta["val"]
            out = g.call_function(aten.matmul.default, (probs, v))
            out.meta["val"] = _fake_value(vv, lambda: torch.matmul(probs.meta["val"], vv))
        # only the last node computes what the fused op did: it alone keeps its numeric-debugger identity
        for new in (kt, scores, scaled, probs):
            new.meta.update(_meta_without_identity(node.meta))
        out.meta.update({key: val for key, val in node.meta.items() if key not in ("val", "tensor_meta")})
        node.replace_all_uses_with(out)
        g.erase_node(node)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm


def einsum_matmul_plan(equation: str) -> tuple[list[int], list[int], list[int]] | None:
    """How ``einsum(equation, a, b)`` is ``permute(matmul(permute(a, pa), permute(b, pb)), po)``:
    ``(pa, pb, po)``, or None when it is not one batched matmul.

    Each index of the two operands is a batch index (in a, b and the output), the row index M
    (a and output), the contracted index K (a and b) or the column index N (b and output); the
    equation is a matmul when there is exactly one M, one K and one N, no index is repeated
    within an operand and none is summed out of a single operand. ``pa`` orders a as
    [batch..., M, K], ``pb`` orders b as [batch..., K, N] (batch in the output's order) and ``po``
    takes the matmul's [batch..., M, N] to the output's order. Spaces are ignored (torch's own
    parser ignores them too); an ellipsis is not handled (None)."""
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    inputs, out = eq.split("->")
    operands = inputs.split(",")
    if len(operands) != 2:
        return None
    a, b = operands
    if any(len(set(t)) != len(t) for t in (a, b, out)):
        return None
    batch = [i for i in out if i in a and i in b]
    m = [i for i in out if i in a and i not in b]
    n = [i for i in out if i in b and i not in a]
    k = [i for i in a if i in b and i not in out]
    if (len(m), len(n), len(k)) != (1, 1, 1) or len(batch) + 3 != len(set(a + b)) or len(out) != len(batch) + 2:
        return None
    mm_out = batch + m + n
    return ([a.index(i) for i in batch + m + k], [b.index(i) for i in batch + k + n],
            [mm_out.index(i) for i in out])


def _permuted(g, node: Node, perm: list[int]) -> Node:
    """``permute(node, perm)`` inserted at the graph's insertion point (``node`` when the
    permutation is the identity), with its fake value."""
    if perm == sorted(perm):
        return node
    val = node.meta["val"]
    new = g.call_function(aten.permute.default, (node, perm))
    new.meta["val"] = _fake_value(val, lambda: val.permute(perm))
    return new


def einsum_as_matmul(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite each two-operand ``einsum`` that is a batched matmul (:func:`einsum_matmul_plan`)
    as permutes around ``matmul`` (in place, also returned), so the quantizer sees an activation
    matmul (rule MATMUL) whose operands are views of their producers. MaxViT writes attention
    this way (``einsum("BGHID,BGHJD->BGHIJ", q, k)``). Exact: the same products and sums in
    float32, summed in another order. Other einsums are left as they are (scalar path)."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in EINSUM or len(node.args) != 2:
            continue
        equation, operands = node.args
        plan = einsum_matmul_plan(equation) if isinstance(equation, str) else None
        if plan is None or len(operands) != 2 or not all(is_float_tensor(a) for a in operands):
            continue
        pa, pb, po = plan
        g = gm.graph
        with g.inserting_before(node):
            a = _permuted(g, operands[0], pa)
            b = _permuted(g, operands[1], pb)
            product = g.call_function(aten.matmul.default, (a, b))
            av, bv = a.meta["val"], b.meta["val"]
            product.meta["val"] = _fake_value(av, lambda: torch.matmul(av, bv))
            out = _permuted(g, product, po)
        # the last node computes what the einsum did: it alone keeps its numeric-debugger identity
        for new in {a, b, product} - {operands[0], operands[1], out}:
            new.meta.update(_meta_without_identity(node.meta))
        out.meta.update({key: val for key, val in node.meta.items() if key not in ("val", "tensor_meta")})
        node.replace_all_uses_with(out)
        g.erase_node(node)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm


def is_zero_pad(node: Node) -> bool:
    """True for a constant pad with the value 0 (``constant_pad_nd(x, widths[, 0])``,
    ``pad(x, widths, "constant"[, 0 / None])``): its output holds only input values and 0,
    which every PT2E grid represents exactly, so it can share the input's qparams."""
    if node.target == aten.constant_pad_nd.default:
        return float(node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)) == 0.0
    if node.target == aten.pad.default:
        mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
        value = node.args[3] if len(node.args) > 3 else node.kwargs.get("value")
        return mode == "constant" and (value is None or float(value) == 0.0)
    return False


def drop_empty_pads(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Remove each pad whose widths are all 0 (in place, also returned): an identity that would
    otherwise break the integer chain. Swin pads each stage to a multiple of its window, which
    at 224 x 224 is a pad by nothing (56, 28, 14 and 7 are multiples of 7)."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in PAD or len(node.args) < 2:
            continue
        widths = node.args[1]
        if isinstance(node.args[0], Node) and isinstance(widths, (list, tuple)) and all(
                isinstance(w, int) and w == 0 for w in widths):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm
