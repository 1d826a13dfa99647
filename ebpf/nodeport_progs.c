/* netagent tc path: the programs (ebpf/nodeport.c says what each does), for both IP families.
 *
 * Compiled last (ebpf/loader.py), after both families' flow code (ebpf/nodeport_flow.c): each
 * packet goes to its family's (the skb's protocol, set from its Ethernet header); anything
 * else passes untouched.
 */

#define NA_IS_IPV6(skb) ((skb)->protocol == NA_HTONS(ETH_P_IPV6))

int na_tc_ingress(struct __sk_buff *skb)
{
    return NA_IS_IPV6(skb) ? translate_new6(skb, 0) : translate_new(skb, 0);
}

int na_tc_from_pod(struct __sk_buff *skb)
{
    return NA_IS_IPV6(skb) ? translate_new6(skb, 1) : translate_new(skb, 1);
}

int na_tc_egress(struct __sk_buff *skb)
{
    if (NA_IS_IPV6(skb)) {
        struct na_flow6 flow6 = {};

        if (parse6(skb, &flow6))
            known6(skb, &flow6, NA_CT_REPLY);
        return TC_ACT_OK;
    }
    struct na_flow flow = {};

    if (parse(skb, &flow))
        known(skb, &flow, NA_CT_REPLY);
    return TC_ACT_OK;
}
