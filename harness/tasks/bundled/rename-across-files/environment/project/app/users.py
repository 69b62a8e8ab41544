USERS = {1: "alice", 2: "bob"}


def get_usr(user_id):
    return USERS[user_id]
