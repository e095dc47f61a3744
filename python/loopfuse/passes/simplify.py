"""placeholder"""
def run(module_op):
    pass
